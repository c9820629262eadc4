package config

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/configuration.md's tables of variables from Variables")

const configurationDoc = "../../docs/configuration.md"

// docs/configuration.md's tables of variables are written from Variables,
// between the lines `<!-- variables: SECTION -->` and `<!-- end of
// variables -->`; after a change to a variable, rewrite them with
//
//	go test ./internal/config -run TestDocumentationTables -update
func TestDocumentationTables(t *testing.T) {
	raw, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := withTables(string(raw), Variables())
	if err != nil {
		t.Fatalf("%s: %v", configurationDoc, err)
	}
	if want == string(raw) {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(configurationDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/configuration.md's tables of variables differ from Variables(); rewrite them with\n\tgo test ./internal/config -run TestDocumentationTables -update")
}

const (
	tableStart = "<!-- variables: "
	tableEnd   = "<!-- end of variables -->"
)

// withTables is doc with the table of each section between its markers
// written anew from vars. Every section must have its place, once.
func withTables(doc string, vars []Variable) (string, error) {
	var sections []string
	for _, v := range vars {
		if !slices.Contains(sections, v.Section) {
			sections = append(sections, v.Section)
		}
	}
	var out strings.Builder
	var placed []string
	for {
		i := strings.Index(doc, tableStart)
		if i < 0 {
			break
		}
		rest := doc[i+len(tableStart):]
		section, _, ok := strings.Cut(rest, " -->\n")
		if !ok || !slices.Contains(sections, section) {
			return "", fmt.Errorf("%q is not a section of Variables (%s)", section, strings.Join(sections, ", "))
		}
		if slices.Contains(placed, section) {
			return "", fmt.Errorf("section %s has two tables", section)
		}
		placed = append(placed, section)
		j := strings.Index(rest, tableEnd)
		if j < 0 {
			return "", fmt.Errorf("the table of section %s has no %s", section, tableEnd)
		}
		out.WriteString(doc[:i])
		out.WriteString(tableStart + section + " -->\n\n")
		out.WriteString(markdownTable(vars, section))
		out.WriteString("\n" + tableEnd)
		doc = rest[j+len(tableEnd):]
	}
	out.WriteString(doc)
	for _, s := range sections {
		if !slices.Contains(placed, s) {
			return "", fmt.Errorf("section %s has no table: add the lines %s%s --> and %s", s, tableStart, s, tableEnd)
		}
	}
	return out.String(), nil
}

// markdownTable is the table of section's variables, in their order.
func markdownTable(vars []Variable, section string) string {
	var b strings.Builder
	b.WriteString("| variable | default | Hawk alias | meaning |\n|---|---|---|---|\n")
	for _, v := range vars {
		if v.Section != section {
			continue
		}
		def, alias, doc := "unset", "", v.Doc
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		if v.Alias != "" {
			alias = "`" + v.Alias + "`"
		}
		if v.Secret {
			doc += " Secret."
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, def, alias, doc)
	}
	return b.String()
}

// A range is written once, in the variable's value, and its doc shows it
// there, once.
func TestDocsShowRanges(t *testing.T) {
	for _, s := range variables(new(Config)) {
		if n := strings.Count(s.doc, rangeMark); (s.value.span != "") != (n == 1) || n > 1 {
			t.Errorf("%s: range %q, and its doc has %s %d times: %s", s.name, s.value.span, rangeMark, n, s.doc)
		}
	}
}
