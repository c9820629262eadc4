#!/usr/bin/env bash
# Runs a second broker, RabbitMQ 4 from Debian trixie, beside the machine's
# own (3.10 on Debian 12), for benchmarks that compare the two
# (docs/benchmarks.md). It lives in a trixie root made with debootstrap at
# $ROOT, listens on 127.0.0.1:5673 as node rabbit4@localhost, and keeps
# nothing the machine's broker uses. Tests never need it.
#
#   scripts/rabbitmq4.sh start   # make the root if missing, start the node
#   scripts/rabbitmq4.sh stop    # stop it, unmount the root's /proc, /dev, /sys
#
# tools/bench meters the node listening on its -amqp port. Stop the machine's
# own broker (rabbitmqctl stop) while benchmarking or testing this one all
# the same: idle, it still takes CPU, and the tests that drive a node with
# rabbitmqctl address that one. Start it again after (rabbitmq-server
# -detached).
set -euo pipefail
ROOT=${ROOT:-/srv/trixie}
ctl() { chroot "$ROOT" su rabbitmq -s /bin/sh -c "HOME=/var/lib/rabbitmq $*"; }

case "${1:-}" in
start)
	if [ ! -x "$ROOT/usr/sbin/rabbitmq-server" ]; then
		command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
		debootstrap --variant=minbase --include=rabbitmq-server trixie "$ROOT" http://deb.debian.org/debian
	fi
	for m in proc dev sys; do
		mountpoint -q "$ROOT/$m" && continue
		case $m in
		proc) mount -t proc proc "$ROOT/proc" ;;
		dev) mount --bind /dev "$ROOT/dev" ;;
		sys) mount -t sysfs sys "$ROOT/sys" ;;
		esac
	done
	cat >"$ROOT/etc/rabbitmq/rabbitmq-env.conf" <<-'EOF'
		NODENAME=rabbit4@localhost
		NODE_PORT=5673
		ERL_EPMD_ADDRESS=127.0.0.1
		export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
	EOF
	echo 'listeners.tcp.local = 127.0.0.1:5673' >"$ROOT/etc/rabbitmq/rabbitmq.conf"
	echo '[rabbitmq_consistent_hash_exchange].' >"$ROOT/etc/rabbitmq/enabled_plugins"
	chroot "$ROOT" chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
	ctl rabbitmq-server -detached
	# await_startup fails at once while the node is not up to answer yet.
	for _ in $(seq 60); do
		ctl rabbitmqctl -q -n rabbit4@localhost await_startup >/dev/null 2>&1 && break
		sleep 1
	done
	ctl rabbitmqctl -q -n rabbit4@localhost await_startup
	echo "RabbitMQ 4 at amqp://guest:guest@127.0.0.1:5673/"
	;;
stop)
	ctl rabbitmqctl -q -n rabbit4@localhost stop 2>/dev/null || true
	for m in sys dev proc; do mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m"; done
	;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
