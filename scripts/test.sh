#!/usr/bin/env bash
# Runs every test of Klaxon against real Redis, RabbitMQ and FerretDB,
# starting the services that do not answer. Extra arguments go to go test.
# (go test -short ./... runs only the tests that need no service, with none
# started.)
#
# Four phases run alone, not beside other packages' tests: first, on a
# machine not yet busy, Sentinel failovers, whose sentinels take a node
# busy for a second for a dead one, and Redis Cluster slots moved
# mid-stream (redis-cli --cluster reshard), which take both cores for tens
# of seconds; then, once everything else has finished, a restart of the
# broker itself (rabbitmqctl stop_app / start_app), when no other test may
# be using RabbitMQ; and, last, the fairness cases, which bound a
# notification's delay and leave the broker busy deleting their queues.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_services
go vet ./...
KLAXON_TEST_SENTINEL=1 go test -p 1 -race -count=1 -timeout 8m "$@" -run '^TestSentinel|^TestChaosSentinel' ./internal/testenv ./cmd/worker ./tools/chaos
KLAXON_TEST_RESHARD=1 go test -p 1 -race -count=1 -timeout 5m "$@" -run 'Reshard' ./internal/counter ./tools/chaos
go test -race -count=1 -timeout 12m "$@" ./...
KLAXON_TEST_BROKER_RESTART=1 go test -race -count=1 -timeout 5m "$@" -run '^TestBrokerRestart$' ./cmd/worker
KLAXON_TEST_FAIRNESS=1 go test -race -count=1 -timeout 8m "$@" -run '^TestFairness' ./cmd/worker
