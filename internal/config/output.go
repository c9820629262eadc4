package config

import (
	"log/slog"
	"strconv"
	"strings"
)

// attrs is the configuration as it may be shown, each variable under its
// name without KLAXON_ in lower case, in the order of Variables: URLs
// without their user info or credential parameters, and secrets as xxxxx
// when set.
func (c Config) attrs() []slog.Attr {
	var out []slog.Attr
	for _, v := range variables(&c) {
		key := strings.ToLower(strings.TrimPrefix(v.name, "KLAXON_"))
		val := v.value.show()
		mode := v.log
		if v.secret && mode == logValue {
			mode = logHidden
		}
		switch mode {
		case logValue:
			out = append(out, slog.Attr{Key: key, Value: val})
		case logURL:
			out = append(out, slog.String(key, redactURL(val.String())))
		case logHidden:
			shown := ""
			if val.String() != "" {
				shown = redacted
			}
			out = append(out, slog.String(key, shown))
		case logWhetherSet:
			out = append(out, slog.Bool(key, val.String() != ""))
		}
		if v.logAlso != nil {
			out = append(out, v.logAlso())
		}
	}
	return out
}

// LogValue makes slog print the configuration as a group, secrets redacted:
// slog.Info("starting", "config", cfg).
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(c.attrs()...)
}

// String returns key=value pairs, secrets redacted.
func (c Config) String() string {
	var b strings.Builder
	for i, a := range c.attrs() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.Key)
		b.WriteByte('=')
		v := a.Value.String()
		if v == "" || strings.ContainsAny(v, " \"=") {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	return b.String()
}

// GoString keeps %#v from printing the secret fields.
func (c Config) GoString() string {
	return "config.Config{" + c.String() + "}"
}
