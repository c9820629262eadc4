package store

import (
	"testing"

	"gopkg.in/yaml.v3"
)

// yaml.v3 names the line of the enclosing block or flow of a syntax
// error; CorrectYAMLLine names the line the error is on.
func TestCorrectYAMLLine(t *testing.T) {
	for _, c := range []struct {
		doc  string
		line string
	}{
		{"a:\n  - id: a\n    isEnabled: true\n   whatToReceive: ONLY_NEW\n", "yaml: line 4: "},
		{"a:\n  - id: a\n    b: c: d\n", "yaml: line 3: "},
		{"a:\n  - id: a\n  x: 1\n", "yaml: line 3: "}, // yaml.v3: line 1
	} {
		var n yaml.Node
		err := yaml.Unmarshal([]byte(c.doc), &n)
		if err == nil {
			t.Fatalf("%q parses", c.doc)
		}
		msg := "rules file x.yml: " + err.Error()
		got := CorrectYAMLLine(msg, []byte(c.doc))
		if want := "rules file x.yml: " + c.line; len(got) < len(want) || got[:len(want)] != want {
			t.Errorf("%q: %q, want it to start %q (yaml.v3 said %q)", c.doc, got, want, err)
		}
	}
	if got := CorrectYAMLLine("open x.yml: no such file", nil); got != "open x.yml: no such file" {
		t.Errorf("a message without a line changed: %q", got)
	}
}
