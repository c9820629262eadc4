#!/usr/bin/env bash
# Runs Klaxon end to end: starts Redis and RabbitMQ when they do not answer,
# runs a MongoDB stand-in of its own and the worker, publishes sample events
# and prints the notifications as they arrive. It changes no broker setting
# or plugin, and deletes its queues (klaxon-demo…) and Redis keys
# (klaxon-demo:…) at the end; "scripts/demo.sh -clean" only deletes them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_redis
ensure_rabbitmq
mkdir -p bin
go build -o bin/klaxon-worker ./cmd/worker
go build -o bin/klaxon ./cmd/klaxon
go build -o bin/devmongo ./tools/devmongo
go build -o bin/klaxon-demo ./tools/demo
exec bin/klaxon-demo "$@"
