package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestLoadEndpointSettings(t *testing.T) {
	c, err := Load(env(map[string]string{
		EnvAllowPrivateNetworks: " 127.0.0.0/8, ::1/128,10.1.2.3 ,",
		EnvAllowPorts:           "443, 8443,443",
		EnvSlackHosts:           "hooks.slack.com/services/, 127.0.0.1",
		EnvTelegramHookHosts:    "*",
		EnvLoopHosts:            "loop.example.com/hooks/, *.loop.ru",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.AllowPrivateNetworks != "127.0.0.0/8,::1/128,10.1.2.3/32" || c.AllowPorts != "443,8443" ||
		c.SlackHosts != "hooks.slack.com/services/,127.0.0.1" || c.TelegramHookHosts != "*" {
		t.Errorf("got %q %q %q %q", c.AllowPrivateNetworks, c.AllowPorts, c.SlackHosts, c.TelegramHookHosts)
	}
	p := c.EndpointPolicy()
	if len(p.Allow) != 3 || p.Allow[2] != netip.MustParsePrefix("10.1.2.3/32") || len(p.Ports) != 2 || p.Ports[1] != 8443 {
		t.Errorf("policy %+v", p)
	}
	if got := c.SlackPatterns(); len(got) != 2 || got[1].Host != "127.0.0.1" {
		t.Errorf("slack patterns %v", got)
	}
	if got := c.LoopPatterns(); len(got) != 2 || got[0].String() != "loop.example.com/hooks/" || got[1].Host != "*.loop.ru" {
		t.Errorf("loop patterns %v", got)
	}

	def, _ := Load(env(nil))
	if p := def.EndpointPolicy(); p.Allow != nil || len(p.Ports) != 2 {
		t.Errorf("default policy %+v", p)
	}
	if got := def.TelegramHookPatterns(); len(got) != 1 || got[0].String() != "notify.bot.codex.so" {
		t.Errorf("default telegram hook patterns %v", got)
	}
	if got := def.LoopPatterns(); len(got) != 1 || got[0].Host != "*" {
		t.Errorf("default loop patterns %v", got)
	}
}

// An invalid value stops start-up with one line naming the variable.
func TestLoadEndpointSettingsInvalid(t *testing.T) {
	tests := []struct{ name, value, want string }{
		{EnvAllowPrivateNetworks, "10.0.0.0/33", `"10.0.0.0/33" is not a CIDR`},
		{EnvAllowPrivateNetworks, "localhost", `"localhost" is not a CIDR`},
		{EnvAllowPrivateNetworks, "10.0.0.1/8", "write 10.0.0.0/8, or 10.0.0.1/32"},
		{EnvAllowPorts, "80,http", `"http" is not a port`},
		{EnvAllowPorts, "0", `"0" is not a port`},
		{EnvAllowPorts, ",", "names no port"},
		{EnvSlackHosts, "https://hooks.slack.com/services/", "without a scheme"},
		{EnvTelegramHookHosts, ", ,", "no pattern"},
		{EnvLoopHosts, "https://loop.example.com/", "without a scheme"},
	}
	for _, tt := range tests {
		_, err := Load(env(map[string]string{tt.name: tt.value}))
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != tt.name || !strings.Contains(err.Error(), tt.want) ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%q: %v, want %q", tt.name, tt.value, err, tt.want)
		}
	}
}

// KLAXON_EVENT_URL links messages to the tracker: Hawk's own page of the
// event by its id by default, any http(s) template, or none (an empty
// value is unset, as for every variable, and takes the default).
// KLAXON_EVENT_URL_FALLBACK is the link when the id is unknown: Garage's
// project page beside the default, none beside a template of one's own
// (Garage's page would be another installation's).
func TestLoadEventURL(t *testing.T) {
	const garage, garageProject = "https://garage.hawk.so/project/{projectId}/event/{eventId}/overview", "https://garage.hawk.so/project/{projectId}"
	own := "https://hawk.example.com/project/{projectId}/event/{eventId}/overview"
	byHash := "https://tracker.example.com/{projectId}/groups/{groupHash}"
	for _, tt := range []struct{ url, fallback, wantURL, wantFallback string }{
		{"", "", garage, garageProject},
		{"none", "", "", ""},
		{"NONE", "", "", ""},
		{own, "", own, ""},
		{own, byHash, own, byHash},
		{own, "none", own, ""},
		{"", "none", garage, ""},
		{byHash, "", byHash, ""},
	} {
		c, err := Load(env(map[string]string{EnvEventURL: tt.url, EnvEventURLFallback: tt.fallback}))
		if err != nil || c.EventURL != tt.wantURL || c.EventURLFallback != tt.wantFallback {
			t.Errorf("%q, fallback %q: %q, %q, %v; want %q, %q", tt.url, tt.fallback, c.EventURL, c.EventURLFallback, err, tt.wantURL, tt.wantFallback)
		}
	}
	for _, bad := range []struct{ name, value, want string }{
		{EnvEventURL, "garage.hawk.so/project/{projectId}", "not an absolute http(s) URL"},
		{EnvEventURL, "ftp://x/{groupHash}", "not an absolute http(s) URL"},
		{EnvEventURL, "https://", "not an absolute http(s) URL"},
		{EnvEventURLFallback, "tracker/{groupHash}", "not an absolute http(s) URL"},
		{EnvEventURLFallback, "https://garage.hawk.so/project/{projectId}/event/{eventId}", "{eventId}"},
	} {
		_, err := Load(env(map[string]string{bad.name: bad.value}))
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != bad.name || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s=%q: %v, want an error naming %s saying %q", bad.name, bad.value, err, bad.name, bad.want)
		}
	}
}
