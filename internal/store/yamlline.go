package store

import (
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// yamlLine matches the line yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`yaml: line (\d+): `)

// CorrectYAMLLine puts the line a YAML syntax error is really on into the
// error's text. yaml.v3 reports the line of the enclosing block or flow
// (its context mark): an indentation slip on line 3 was "line 1". The line
// is found as the shortest start of the file that fails the same way.
// msg is the error's text, data the file it came from; a message without
// a YAML line is returned as it is.
func CorrectYAMLLine(msg string, data []byte) string {
	m := yamlLine.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	reported, _ := strconv.Atoi(msg[m[2]:m[3]])
	what := msg[m[1]:]
	lines := strings.SplitAfter(string(data), "\n")
	fails := func(n int) bool {
		err := yamlUnmarshalCheck([]byte(strings.Join(lines[:n], "")))
		return err != nil && strings.HasSuffix(err.Error(), what)
	}
	lo, hi := max(reported, 1), len(lines)
	if !fails(hi) {
		return msg
	}
	for lo < hi { // the shortest failing start, assuming longer ones fail too
		mid := (lo + hi) / 2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == reported {
		return msg
	}
	return msg[:m[2]] + strconv.Itoa(lo) + msg[m[3]:]
}

func yamlUnmarshalCheck(data []byte) error {
	var n yaml.Node
	return yaml.Unmarshal(data, &n)
}
