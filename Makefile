# Berth's build. `make help` lists the targets.

GO        ?= go
BIN       := $(CURDIR)/bin
K8S_BIN   := $(BIN)/k8s
TOOLS_BIN := $(BIN)/tools

# envtest and the local cluster environment find etcd, kube-apiserver and kubectl here.
export KUBEBUILDER_ASSETS := $(K8S_BIN)

# Fuzz targets run briefly by `make test`; `make fuzz FUZZTIME=2000000x` runs them longer.
# A count, not a duration: Go 1.26's fuzz coordinator can fail a clean run with
# "context deadline exceeded" when a duration ends mid-execution (go.dev/issue/75804).
FUZZTIME ?= 50000x
# A new input is minimized for at most this many executions: a smoke run needs
# no small reproducers, and the slowest target (FuzzAgent, a few hundred
# executions a second) would spend minutes minimizing at Go's default of 60 s.
FUZZMINIMIZETIME ?= 100x
FUZZ_TARGETS := \
	./leaseapi:FuzzDecode \
	./leaseapi:FuzzParseKey \
	./leaseapi/lease:FuzzMachine \
	./leaseapi/server:FuzzServer \
	./admission:FuzzDecideCreate \
	./fence:FuzzDeadline \
	./admission:FuzzDecideUpdate \
	./reconciler:FuzzDecide \
	./reconciler:FuzzAgent

# Modules beside the product's with tests of their own: they keep the image builder's and
# Prometheus's dependencies out of the product's module graph.
TEST_MODULES := hack/imagebuild test/monitoring

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: build
build: ## Build berth-leaseapi, berth-agent, berthctl and berth-fence (static) into bin/.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $$($(GO) list ./cmd/... | grep -v '/cmd/berth-fence$$')
	CGO_ENABLED=0 $(GO) build -o $(BIN)/berth-fence ./cmd/berth-fence

.PHONY: images
images: ## Build the OCI images (linux/amd64 and linux/arm64) of the three binaries into bin/images/ (berth-fence inside berth-agent's).
	cd hack/imagebuild && $(GO) run . -repo-root $(CURDIR) -out $(BIN)/images

.PHONY: generate
generate: $(TOOLS_BIN)/controller-gen $(TOOLS_BIN)/helm ## Generate deepcopy, CRDs and RBAC from the markers, the admission manifests, the charts' generated files and deploy/install.
	$(TOOLS_BIN)/controller-gen object paths=./api/...
	$(TOOLS_BIN)/controller-gen crd paths=./api/... output:crd:artifacts:config=deploy/crd
	$(TOOLS_BIN)/controller-gen rbac:roleName=berth-agent paths=./... output:rbac:artifacts:config=deploy/rbac
	$(GO) test ./admission -run TestDeployManifests -update
	$(GO) run ./hack/chartgen
	hack/render-install.sh $(TOOLS_BIN)/helm

.PHONY: verify-gen
verify-gen: generate ## Fail when generated files are stale.
	@git diff --exit-code -- api deploy || { echo "generated files are stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api deploy)" || { git status --porcelain -- api deploy; echo "untracked generated files: run make generate and commit"; exit 1; }

.PHONY: fmt
fmt: ## Format the Go sources.
	$(GO) fmt ./...

.PHONY: vet
vet: ## Run go vet on every module, and fail when a module's go.mod or go.sum is not tidy.
	$(GO) vet ./...
	@set -e; for m in . $(TEST_MODULES); do \
		(cd $$m && $(GO) mod tidy -diff >/dev/null) || { echo "$$m: go.mod or go.sum is not tidy: run (cd $$m && go mod tidy) and commit"; exit 1; }; \
	done
	@set -e; for m in $(TEST_MODULES); do (cd $$m && $(GO) vet ./...); done

.PHONY: lint
lint: $(TOOLS_BIN)/golangci-lint ## Check formatting (gofmt) and run golangci-lint.
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$unformatted" || { echo "gofmt would change: $$unformatted"; exit 1; }
	$(TOOLS_BIN)/golangci-lint run ./...

##@ Testing

# `make test`'s stages, in order. hack/test-stages.sh runs them, stops at the first that
# fails, and ends with the time each took (every Go package or fuzz target over 30 s on a
# line of its own), also written to bin/test-times.md; the whole log is bin/test.log.
TEST_STAGES := check-files tools build vet lint verify-gen test-go-product \
	$(addprefix test-module-,$(TEST_MODULES)) fuzz

.PHONY: test
test: ## Run every test and check: tracked files, lint, generated files, unit, integration, fuzz smoke, process and end-to-end; then print where the time went.
	@MAKE="$(MAKE)" BIN="$(BIN)" hack/test-stages.sh $(TEST_STAGES)

.PHONY: check-files
check-files: ## Fail when git tracks a build output (an executable binary, or a file over 1 MiB).
	./hack/check-tracked-files.sh

.PHONY: test-go
test-go: test-go-product $(addprefix test-module-,$(TEST_MODULES)) ## Run the Go tests of every module (needs `make tools` for the suites on real clusters).

.PHONY: test-go-product
test-go-product: ## Run the Go tests of the product's module.
	$(GO) test -count=1 -timeout 25m ./...

.PHONY: $(addprefix test-module-,$(TEST_MODULES))
$(addprefix test-module-,$(TEST_MODULES)): test-module-%:
	cd $* && $(GO) test -count=1 -timeout 25m ./...

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME executions (default 50000x).
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$$fn$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg; \
	done

# `make soak` runs SEEDS random chaos schedules on one fleet (DURATION, e.g. 30m, stops
# drawing new ones early), or replays SEED=s[,s...]. It prints each schedule's verdict, the
# seed of every failure, and a summary line; the whole log goes to SOAK_LOG. With
# BERTH_CHAOS_WORKDIR=DIR the fleet's folder (every process's log) is kept there.
SEEDS    ?= 20
SEED     ?=
DURATION ?=
SOAK_LOG ?= $(BIN)/soak.log

.PHONY: soak
soak: tools ## Run SEEDS random chaos schedules on one fleet (or replay SEED=s), printing failing seeds and a summary.
	@mkdir -p $(BIN)
	@{ BERTH_CHAOS_SEED=$(SEED) BERTH_CHAOS_SEEDS=$(SEEDS) BERTH_CHAOS_DURATION=$(DURATION) \
		$(GO) test -count=1 -timeout 0 -v -run '^TestChaos$$' ./test/chaos 2>&1; echo "exit $$?"; } \
		| tee $(SOAK_LOG) | grep --line-buffered -E '^(chaos|soak):|^ +|^(--- FAIL|FAIL|panic)' | grep --line-buffered -v -E '^ +[a-z_]+\.go:[0-9]+:'
	@echo "full log: $(SOAK_LOG)"; tail -n 1 $(SOAK_LOG) | grep -qx 'exit 0'

.PHONY: bench
bench: build ## Run the benchmarks and print the figures quoted in docs/benchmarks.md.
	hack/bench.sh

# `make bench-scale` runs the scale benchmark of issue 13 over CLUSTERS × N (comma-separated
# lists; one cell: `make bench-scale CLUSTERS=2 N=1000`), passing AGENT_ARGS to every
# berth-agent. Each cell starts its own local clusters: run it on a quiet machine.
CLUSTERS      ?= 2,3
N             ?= 1000,10000
TTL           ?= 30s
HEARTBEAT     ?= 10s
WINDOW        ?= 60s
PHASE_TIMEOUT ?= 5m
AGENT_ARGS    ?=

.PHONY: bench-scale
bench-scale: tools build ## Scale benchmark (issue 13): CLUSTERS × N BerthLeases per cluster, convergence, steady state, kill, cordon.
	CLUSTERS=$(CLUSTERS) N=$(N) TTL=$(TTL) HEARTBEAT=$(HEARTBEAT) WINDOW=$(WINDOW) \
		PHASE_TIMEOUT=$(PHASE_TIMEOUT) AGENT_ARGS="$(AGENT_ARGS)" hack/bench-scale.sh

##@ Running

.PHONY: demo
demo: tools build ## Three local clusters, the lease API and an agent each: kill the running cluster, watch the takeover.
	$(GO) run ./test/demo --bin $(BIN)

##@ Tools

.PHONY: tools
tools: $(TOOLS_BIN)/helm ## Build the pinned control-plane binaries into bin/k8s (cached per user, reused) and helm into bin/tools.
	hack/build-tools.sh

$(TOOLS_BIN)/golangci-lint: hack/tools/go.mod
	cd hack/tools && GOBIN=$(TOOLS_BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint

$(TOOLS_BIN)/helm: hack/tools/helm/go.mod
	cd hack/tools/helm && GOBIN=$(TOOLS_BIN) $(GO) install helm.sh/helm/v4/cmd/helm

$(TOOLS_BIN)/controller-gen: hack/tools/go.mod
	cd hack/tools && GOBIN=$(TOOLS_BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: clean
clean: ## Remove build output (the per-user tool cache is kept).
	rm -rf $(BIN)
