#!/usr/bin/env bash
# Starts the local services Klaxon's tests and demo need, when they do not
# answer: Redis on 127.0.0.1:6379 and RabbitMQ on 127.0.0.1:5672, with its
# consistent-hash exchange plugin enabled. MongoDB needs nothing: tests and
# the demo run FerretDB in-process (tools/devmongo).
# Source it, then call ensure_services.

install_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "services: installing $2" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"; } >/dev/null
}

answers() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

ensure_redis() {
  install_pkg redis-server redis-server
  install_pkg redis-cli redis-tools
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
  echo "services: starting Redis on 127.0.0.1:6379" >&2
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "services: Redis did not start, see /var/log/redis/ci.log" >&2
  return 1
}

ensure_rabbitmq() {
  install_pkg rabbitmq-server rabbitmq-server
  # amqp-publish, which the README's first rule publishes its event with.
  install_pkg amqp-publish amqp-tools
  if answers 127.0.0.1 5672 && rabbitmqctl -q status >/dev/null 2>&1; then return 0; fi
  echo "services: starting RabbitMQ on 127.0.0.1:5672" >&2
  rabbitmq-server -detached >/dev/null 2>&1 || true
  timeout 120 rabbitmqctl -q await_startup
  for _ in $(seq 200); do
    answers 127.0.0.1 5672 && return 0
    sleep 0.1
  done
  echo "services: RabbitMQ did not start" >&2
  return 1
}

# Hashed incoming queues (KLAXON_QUEUE_SHARDS, docs/scaling.md) need the
# consistent-hash exchange: a plugin RabbitMQ ships but does not enable.
# Enabling it starts the plugin on the running node, without a restart; when
# it is on already, nothing is done at all.
ensure_hash_exchange() {
  if rabbitmq-plugins -q is_enabled rabbitmq_consistent_hash_exchange >/dev/null 2>&1; then return 0; fi
  echo "services: enabling the RabbitMQ plugin rabbitmq_consistent_hash_exchange" >&2
  rabbitmq-plugins -q enable rabbitmq_consistent_hash_exchange >/dev/null
}

ensure_services() {
  ensure_redis && ensure_rabbitmq && ensure_hash_exchange
}
