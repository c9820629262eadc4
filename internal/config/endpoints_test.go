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

// KLAXON_EVENT_URL links messages to the tracker: Hawk's own page by
// default, any http(s) template, or none (an empty value is unset, as for
// every variable, and takes the default).
func TestLoadEventURL(t *testing.T) {
	for value, want := range map[string]string{
		"":     "https://garage.hawk.so/project/{projectId}/event/{groupHash}/overview",
		"none": "",
		"NONE": "",
		"https://hawk.example.com/project/{projectId}/event/{groupHash}": "https://hawk.example.com/project/{projectId}/event/{groupHash}",
	} {
		c, err := Load(env(map[string]string{EnvEventURL: value}))
		if err != nil || c.EventURL != want {
			t.Errorf("%q: %q, %v; want %q", value, c.EventURL, err, want)
		}
	}
	for _, bad := range []string{"garage.hawk.so/project/{projectId}", "ftp://x/{groupHash}", "https://"} {
		_, err := Load(env(map[string]string{EnvEventURL: bad}))
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != EnvEventURL {
			t.Errorf("%q: %v, want an error naming %s", bad, err, EnvEventURL)
		}
	}
}
