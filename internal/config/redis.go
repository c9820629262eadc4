package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis URL forms. The scheme picks the deployment; hosts are separated by
// commas; user info always holds the credentials of the Redis data nodes;
// any option go-redis' URL parsers know (dial_timeout=3s, pool_size=20,
// skip_verify=true, ...) goes in the query:
//
//	redis://[[user]:password@]host[:6379][/db]                   single node
//	rediss://...                                                  the same over TLS
//	unix://[[user]:password@]/path/to/redis.sock[?db=N]           single node, Unix socket
//	redis+cluster://[[user]:password@]host:port[,host:port...]    Redis Cluster (seed nodes; database 0 only)
//	rediss+cluster://...                                          the same over TLS
//	redis+sentinel://[[user]:password@]host[:26379][,host...]/master[/db][?sentinel_password=...]
//	rediss+sentinel://...                                         Sentinel; hosts are the sentinels
//
// A single node or a Sentinel master defaults to port 6379 or 26379 when a
// host has no port. Sentinels that require their own authentication take
// sentinel_username and sentinel_password query parameters.
const (
	redisSingle   = "redis"
	redisCluster  = "cluster"
	redisSentinel = "sentinel"
)

// RedisOptions are the go-redis options KLAXON_REDIS_URL asks for, in the
// library's own type for the deployment, exactly as its URL parser built
// them: exactly one is set. Copying them into another type would drop, on
// a go-redis upgrade, whatever field the copy does not know yet.
type RedisOptions struct {
	Single   *redis.Options         // redis://, rediss://, unix://
	Cluster  *redis.ClusterOptions  // redis+cluster://, rediss+cluster://
	Failover *redis.FailoverOptions // redis+sentinel://, rediss+sentinel://
}

// NewClient returns the client the options are for, as
// redis.NewUniversalClient would choose it: a single-node client, a
// cluster client, or a Sentinel-backed failover client, itself a cluster
// client when it routes reads to replicas (route_by_latency,
// route_randomly).
func (o *RedisOptions) NewClient() redis.UniversalClient {
	switch {
	case o.Cluster != nil:
		return redis.NewClusterClient(o.Cluster)
	case o.routesToReplicas():
		return redis.NewFailoverClusterClient(o.Failover)
	case o.Failover != nil:
		return redis.NewFailoverClient(o.Failover)
	}
	return redis.NewClient(o.Single)
}

// DefaultPoolSize sets the connection pool's size to n unless the URL set
// it (pool_size). go-redis would otherwise size it by Go's processors (10
// each), which says nothing of how many commands a worker has in flight.
func (o *RedisOptions) DefaultPoolSize(n int) {
	var size *int
	switch {
	case o.Cluster != nil:
		size = &o.Cluster.PoolSize
	case o.Failover != nil:
		size = &o.Failover.PoolSize
	default:
		size = &o.Single.PoolSize
	}
	if *size == 0 {
		*size = n
	}
}

// routesToReplicas reports whether a Sentinel client spreads commands over
// the master and its replicas.
func (o *RedisOptions) routesToReplicas() bool {
	return o.Failover != nil && (o.Failover.RouteByLatency || o.Failover.RouteRandomly)
}

// RedisOptions returns the go-redis options for KLAXON_REDIS_URL.
func (c Config) RedisOptions() (*RedisOptions, error) {
	o, err := parseRedisURL(c.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvRedisURL, err)
	}
	return o, nil
}

// parseRedisURL turns a Klaxon Redis URL into go-redis options. It rewrites
// the URL into the form go-redis' own parser for that deployment expects
// (ParseURL, ParseClusterURL or ParseFailoverURL), without the credentials,
// so that a parser's error cannot quote them; then it sets the credentials
// itself.
func parseRedisURL(raw string) (*RedisOptions, error) {
	u, err := splitURL(raw)
	if err != nil {
		return nil, err
	}
	base, kind, _ := strings.Cut(u.scheme, "+")
	switch {
	case u.scheme == "unix":
		base, kind = "unix", redisSingle
	case base != "redis" && base != "rediss":
		return nil, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.scheme)
	case kind == "":
		kind = redisSingle
	case kind != redisCluster && kind != redisSentinel:
		return nil, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.scheme)
	}

	var user, password string
	if u.hasUser {
		if user, password, err = userPassword(u.userinfo); err != nil {
			return nil, err
		}
	}
	rest, _, _ := strings.Cut(u.rest, "#")
	path, rawQuery, _ := strings.Cut(rest, "?")
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, errors.New("the query is not valid: invalid percent-encoding")
	}
	for _, name := range []string{"addr", "username", "password", "master_name"} {
		if query.Has(name) {
			return nil, fmt.Errorf("option %s is not accepted: hosts, credentials and the master name belong in the URL itself", name)
		}
	}
	skipVerify, err := popBool(query, "skip_verify")
	if err != nil {
		return nil, err
	}
	if skipVerify && base != "rediss" {
		return nil, errors.New("skip_verify=true needs a rediss scheme")
	}

	var o RedisOptions
	var tlsConfig *tls.Config
	switch kind {
	case redisSingle:
		if o.Single, err = singleNode(base, u.hosts, path, query); err == nil {
			o.Single.Username, o.Single.Password = user, password
			tlsConfig = o.Single.TLSConfig
		}
	case redisCluster:
		if o.Cluster, err = cluster(base, u.hosts, path, query); err == nil {
			o.Cluster.Username, o.Cluster.Password = user, password
			tlsConfig = o.Cluster.TLSConfig
		}
	case redisSentinel:
		if o.Failover, err = sentinel(base, u.hosts, path, query); err == nil {
			o.Failover.Username, o.Failover.Password = user, password
			tlsConfig = o.Failover.TLSConfig
		}
	}
	if err != nil {
		return nil, err
	}
	if tlsConfig != nil {
		tlsConfig.MinVersion = tls.VersionTLS12
		tlsConfig.InsecureSkipVerify = skipVerify
	}
	return &o, nil
}

func singleNode(scheme string, hosts []string, path string, query url.Values) (*redis.Options, error) {
	if len(hosts) != 1 {
		return nil, errors.New("names several hosts: use redis+cluster:// for a Redis Cluster or redis+sentinel:// for Sentinel")
	}
	host := ""
	if scheme != "unix" {
		h, err := withPort(hosts[0], "6379")
		if err != nil {
			return nil, err
		}
		host = h
	} else if hosts[0] != "" {
		return nil, errors.New("a unix URL has no host: unix:///path/to/redis.sock")
	}
	return redis.ParseURL((&url.URL{Scheme: scheme, Host: host, Path: path, RawQuery: query.Encode()}).String())
}

func cluster(scheme string, hosts []string, path string, query url.Values) (*redis.ClusterOptions, error) {
	if db := strings.Trim(path, "/"); db != "" && db != "0" {
		return nil, fmt.Errorf("database %q: Redis Cluster has database 0 only", db)
	}
	if query.Has("db") {
		return nil, errors.New("option db is not accepted: Redis Cluster has database 0 only")
	}
	addrs, err := withPorts(hosts, "6379")
	if err != nil {
		return nil, err
	}
	query["addr"] = addrs[1:]
	o, err := redis.ParseClusterURL((&url.URL{Scheme: scheme, Host: addrs[0], RawQuery: query.Encode()}).String())
	if err != nil {
		return nil, err
	}
	o.TLSConfig = perHostTLS(o.TLSConfig)
	return o, nil
}

func sentinel(scheme string, hosts []string, path string, query url.Values) (*redis.FailoverOptions, error) {
	segments := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(segments) == 0 || len(segments) > 2 {
		return nil, errors.New("the path must name the master, as in redis+sentinel://sentinel:26379/mymaster or /mymaster/0")
	}
	master, err := urlUnescape(segments[0])
	if err != nil {
		return nil, fmt.Errorf("master name: %w", err)
	}
	dbPath := ""
	if len(segments) == 2 {
		dbPath = "/" + segments[1]
	}
	sentinelUser, sentinelPassword := query.Get("sentinel_username"), query.Get("sentinel_password")
	query.Del("sentinel_username")
	query.Del("sentinel_password")
	if query.Has("use_disconnected_replicas") {
		return nil, errors.New("option use_disconnected_replicas is not supported")
	}
	// Klaxon writes on every batch, and a replica answers every write with
	// READONLY: such a worker would hold all its messages while looking
	// healthy. go-redis' parser knows the option, so it is refused here.
	if replicaOnly, err := popBool(query, "replica_only"); err != nil {
		return nil, err
	} else if replicaOnly {
		return nil, errors.New("option replica_only=true is not accepted: Klaxon writes to Redis, and a replica refuses writes (READONLY); leave it out to use the master")
	}
	addrs, err := withPorts(hosts, "26379")
	if err != nil {
		return nil, err
	}
	query["addr"] = addrs[1:]
	query.Set("master_name", master)
	o, err := redis.ParseFailoverURL((&url.URL{Scheme: scheme, Host: addrs[0], Path: dbPath, RawQuery: query.Encode()}).String())
	if err != nil {
		return nil, err
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPassword
	o.TLSConfig = perHostTLS(o.TLSConfig)
	return o, nil
}

// perHostTLS clears the server name go-redis takes from the first host in
// the URL, so that crypto/tls checks each node's certificate against the
// address it dials: cluster nodes and Sentinel-announced masters are not the
// first host.
func perHostTLS(c *tls.Config) *tls.Config {
	if c != nil {
		c.ServerName = ""
	}
	return c
}

// withPorts checks every host and gives those without a port the default.
func withPorts(hosts []string, port string) ([]string, error) {
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		a, err := withPort(h, port)
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	return addrs, nil
}

func withPort(host, port string) (string, error) {
	if err := checkHostPort(host, false); err != nil {
		return "", err
	}
	if h, p, err := net.SplitHostPort(host); err == nil {
		return net.JoinHostPort(h, p), nil
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), port), nil
}

func popBool(query url.Values, name string) (bool, error) {
	if !query.Has(name) {
		return false, nil
	}
	v := query.Get(name)
	query.Del(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("option %s=%q is not true or false", name, v)
	}
	return b, nil
}
