package abi

// RootContextID returns the id of the plugin's newest root context (0 before the host
// created one). Envoy replaces the root context on every reconfiguration and deletes the
// old one once its streams finish, so calls that must outlive a request (early syncs)
// belong on the newest.
func RootContextID() uint32 { return newestRoot }
