# The two commands a new machine needs: `make run` and `make test`. Everything else is a step of those.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
LISTEN ?= 127.0.0.1:8443
CERT_DIR := certs/dev
SAMPLE := tests/fixtures/admission/mixed/review.json

.PHONY: deps build run test certs clean

deps:
	./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

certs: deps
	./certs/generate.sh --out $(CERT_DIR)

run: build certs
	@echo
	@echo "gpuguard-webhook on https://$(LISTEN) with the default policy. In another terminal:"
	@echo
	@echo "  curl --cacert $(CERT_DIR)/ca.crt -H 'Content-Type: application/json' \\"
	@echo "       --data @$(SAMPLE) 'https://$(LISTEN)/mutate?timeout=10s'"
	@echo
	@echo "  $(BUILD_DIR)/gpuguard-webhook review $(SAMPLE)    # the same review offline, patch decoded"
	@echo
	exec $(BUILD_DIR)/gpuguard-webhook --tls-cert-file $(CERT_DIR)/tls.crt \
	  --tls-private-key-file $(CERT_DIR)/tls.key --listen-address $(LISTEN)

clean:
	rm -rf $(BUILD_DIR)
