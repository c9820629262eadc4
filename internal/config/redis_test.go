package config

import (
	"crypto/tls"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestRedisOptions(t *testing.T) {
	type want struct {
		addrs            []string
		db               int
		master           string
		cluster          bool
		user, password   string
		sentinelPassword string
		tls              bool
		serverName       string
		client           string // type NewUniversalClient returns
	}
	tests := []struct {
		url  string
		want want
	}{
		{"redis://127.0.0.1:6379/0", want{addrs: []string{"127.0.0.1:6379"}, client: "*redis.Client"}},
		{"redis://redis", want{addrs: []string{"redis:6379"}, client: "*redis.Client"}},
		{"redis://:pw@redis:6380/3?dial_timeout=2s", want{addrs: []string{"redis:6380"}, db: 3, password: "pw", client: "*redis.Client"}},
		{"redis://app:p%40ss@[::1]:6379/1", want{addrs: []string{"[::1]:6379"}, db: 1, user: "app", password: "p@ss", client: "*redis.Client"}},
		{"rediss://:pw@redis.example.com/0", want{addrs: []string{"redis.example.com:6379"}, password: "pw", tls: true, serverName: "redis.example.com", client: "*redis.Client"}},
		{"unix:///var/run/redis.sock?db=2", want{addrs: []string{"/var/run/redis.sock"}, db: 2, client: "*redis.Client"}},
		{"redis+cluster://n1:7000,n2:7001,n3", want{addrs: []string{"n1:7000", "n2:7001", "n3:6379"}, cluster: true, client: "*redis.ClusterClient"}},
		{"redis+cluster://:pw@cfg.example.com:6379/0", want{addrs: []string{"cfg.example.com:6379"}, cluster: true, password: "pw", client: "*redis.ClusterClient"}},
		{"rediss+cluster://u:pw@n1:7000,n2:7000/", want{addrs: []string{"n1:7000", "n2:7000"}, cluster: true, user: "u", password: "pw", tls: true, client: "*redis.ClusterClient"}},
		{"redis+sentinel://s1:26379,s2:26380,s3/mymaster", want{addrs: []string{"s1:26379", "s2:26380", "s3:26379"}, master: "mymaster", client: "*redis.Client"}},
		{"redis+sentinel://:pw@s1/mymaster/2?sentinel_password=spw", want{addrs: []string{"s1:26379"}, master: "mymaster", db: 2, password: "pw", sentinelPassword: "spw", client: "*redis.Client"}},
		{"rediss+sentinel://s1:26379/mymaster?skip_verify=true", want{addrs: []string{"s1:26379"}, master: "mymaster", tls: true, client: "*redis.Client"}},
		// As redis.NewUniversalClient: a Sentinel client routing reads to replicas is a cluster client.
		{"redis+sentinel://s1/mymaster?route_randomly=true", want{addrs: []string{"s1:26379"}, master: "mymaster", client: "*redis.ClusterClient"}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			c, err := Load(env(map[string]string{EnvRedisURL: tt.url}))
			if err != nil {
				t.Fatal(err)
			}
			opts, err := c.RedisOptions()
			if err != nil {
				t.Fatal(err)
			}
			o := universal(opts)
			w := tt.want
			if !slices.Equal(o.Addrs, w.addrs) || o.DB != w.db || o.MasterName != w.master || o.IsClusterMode != w.cluster ||
				o.Username != w.user || o.Password != w.password || o.SentinelPassword != w.sentinelPassword || (o.TLSConfig != nil) != w.tls {
				t.Errorf("got addrs=%v db=%d master=%q cluster=%v user=%q password=%q sentinelPassword=%q tls=%v",
					o.Addrs, o.DB, o.MasterName, o.IsClusterMode, o.Username, o.Password, o.SentinelPassword, o.TLSConfig != nil)
			}
			if o.TLSConfig != nil {
				if o.TLSConfig.ServerName != w.serverName || o.TLSConfig.MinVersion != tls.VersionTLS12 {
					t.Errorf("TLS server name %q min version %x", o.TLSConfig.ServerName, o.TLSConfig.MinVersion)
				}
				if got := strings.Contains(tt.url, "skip_verify=true"); o.TLSConfig.InsecureSkipVerify != got {
					t.Errorf("InsecureSkipVerify = %v", o.TLSConfig.InsecureSkipVerify)
				}
			}
			// Clients dial lazily; this only checks which client the options select.
			client := opts.NewClient()
			defer client.Close()
			if got := reflect.TypeOf(client).String(); got != w.client {
				t.Errorf("NewClient returned %s, want %s", got, w.client)
			}
		})
	}
}

// Every option go-redis' URL parsers accept must reach the options the
// client is built from.
func TestRedisOptionsKeepLibraryOptions(t *testing.T) {
	common := "client_name=klaxon&protocol=3&max_retries=7&min_retry_backoff=9ms&max_retry_backoff=1s" +
		"&dial_timeout=2s&read_timeout=4s&write_timeout=6s&pool_fifo=true&pool_size=33&pool_timeout=8s" +
		"&min_idle_conns=2&max_idle_conns=5&max_active_conns=50&max_concurrent_dials=4" +
		"&pipeline_pool_size=3&pipeline_read_buffer_size=4096&pipeline_write_buffer_size=8192" +
		"&conn_max_idle_time=1m&conn_max_lifetime=1h&conn_max_lifetime_jitter=1m"

	t.Run("single", func(t *testing.T) {
		lib, err := redis.ParseURL("rediss://u:pw@redis:6380/3?" + common + "&skip_verify=true")
		if err != nil {
			t.Fatal(err)
		}
		o, err := parseRedisURL("rediss://u:pw@redis:6380/3?" + common + "&skip_verify=true")
		if err != nil {
			t.Fatal(err)
		}
		compareOptions(t, o.Single, lib)
	})

	t.Run("cluster", func(t *testing.T) {
		q := common + "&max_redirects=5&read_only=true&route_randomly=true&dialer_retries=3&dialer_retry_timeout=50ms&failing_timeout_seconds=20"
		lib, err := redis.ParseClusterURL("rediss://u:pw@n1:7000?" + q + "&addr=n2:7001")
		if err != nil {
			t.Fatal(err)
		}
		o, err := parseRedisURL("rediss+cluster://u:pw@n1:7000,n2:7001?" + q)
		if err != nil {
			t.Fatal(err)
		}
		lib.TLSConfig.ServerName = ""
		lib.TLSConfig.MinVersion = tls.VersionTLS12
		compareOptions(t, o.Cluster, lib)
	})

	t.Run("sentinel", func(t *testing.T) {
		q := common + "&dialer_retries=3&dialer_retry_timeout=50ms&context_timeout_enabled=true"
		lib, err := redis.ParseFailoverURL("rediss://s1:26379/2?" + q + "&master_name=mymaster&addr=s2:26380&username=u&password=pw&skip_verify=true")
		if err != nil {
			t.Fatal(err)
		}
		lib.SentinelUsername, lib.SentinelPassword = "su", "spw"
		o, err := parseRedisURL("rediss+sentinel://u:pw@s1:26379,s2:26380/mymaster/2?" + q + "&sentinel_username=su&sentinel_password=spw&skip_verify=true")
		if err != nil {
			t.Fatal(err)
		}
		lib.TLSConfig.ServerName = ""
		compareOptions(t, o.Failover, lib)
	})
}

// universal gathers what TestRedisOptions checks of whichever options o
// holds, in go-redis' UniversalOptions.
func universal(o *RedisOptions) redis.UniversalOptions {
	switch {
	case o.Cluster != nil:
		c := o.Cluster
		return redis.UniversalOptions{Addrs: c.Addrs, IsClusterMode: true, Username: c.Username, Password: c.Password, TLSConfig: c.TLSConfig}
	case o.Failover != nil:
		f := o.Failover
		return redis.UniversalOptions{Addrs: f.SentinelAddrs, DB: f.DB, MasterName: f.MasterName, Username: f.Username, Password: f.Password,
			SentinelPassword: f.SentinelPassword, TLSConfig: f.TLSConfig}
	}
	s := o.Single
	return redis.UniversalOptions{Addrs: []string{s.Addr}, DB: s.DB, Username: s.Username, Password: s.Password, TLSConfig: s.TLSConfig}
}

// compareOptions compares two go-redis option structs field by field, so
// that a failure names the field that was lost.
func compareOptions[T any](t *testing.T, got, want *T) {
	t.Helper()
	g, w := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
	for i := range g.NumField() {
		f := g.Type().Field(i)
		if !f.IsExported() || f.Type.Kind() == reflect.Func {
			continue
		}
		if !reflect.DeepEqual(g.Field(i).Interface(), w.Field(i).Interface()) {
			t.Errorf("%s: got %v, want %v", f.Name, g.Field(i).Interface(), w.Field(i).Interface())
		}
	}
	// A few values must not be zero, or the test proves nothing.
	for _, name := range []string{"PoolSize", "DialTimeout", "ConnMaxLifetime", "TLSConfig"} {
		if w.FieldByName(name).IsZero() {
			t.Errorf("%s is zero in the library's options", name)
		}
	}
}

func TestRedisOptionsErrorNamesVariable(t *testing.T) {
	_, err := Config{RedisURL: "redis://:pw@h/x"}.RedisOptions()
	if err == nil || !strings.HasPrefix(err.Error(), EnvRedisURL+": ") || strings.Contains(err.Error(), "pw") {
		t.Errorf("RedisOptions error = %v", err)
	}
}

// The worker sizes the pool for what it has in flight, unless the URL
// says pool_size, on every kind of deployment.
func TestRedisOptionsDefaultPoolSize(t *testing.T) {
	sizes := func(o *RedisOptions) int {
		switch {
		case o.Cluster != nil:
			return o.Cluster.PoolSize
		case o.Failover != nil:
			return o.Failover.PoolSize
		}
		return o.Single.PoolSize
	}
	for _, url := range []string{"redis://redis:6379/0", "redis+cluster://a:7000,b:7000", "redis+sentinel://s1,s2/mymaster"} {
		for query, want := range map[string]int{"": 85, "?pool_size=7": 7} {
			o, err := parseRedisURL(url + query)
			if err != nil {
				t.Fatalf("%s%s: %v", url, query, err)
			}
			o.DefaultPoolSize(85)
			if got := sizes(o); got != want {
				t.Errorf("%s%s: pool of %d, want %d", url, query, got, want)
			}
		}
	}
}
