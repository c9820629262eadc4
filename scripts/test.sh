#!/usr/bin/env bash
# Runs every test of Klaxon against real Redis, RabbitMQ and FerretDB,
# starting the services that do not answer. Extra arguments go to go test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_services
go vet ./...
go test -race -count=1 -timeout 12m "$@" ./...
