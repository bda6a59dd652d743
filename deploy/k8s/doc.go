// Package k8s holds what Tollgate's Kubernetes deployment is checked with and built by:
// the Helm chart's render test (chart_test.go renders deploy/helm/tollgate with the Helm
// library and decodes every object strictly into its Kubernetes or Istio API type) and
// the image builder (oci, cmd/tollgate-oci).
//
// It is a module of its own so that the main module does not carry Helm's, the
// Kubernetes API's and go-containerregistry's dependencies; `make test` runs it.
package k8s
