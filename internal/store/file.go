package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// FileSource reads rules from a YAML file (KLAXON_RULES_FILE): a mapping
// from project id to that project's list of rules, each with the fields of
// rules.Spec and a free-form id, or to a mapping in the shape of Hawk's
// project document, {name: "Shop", quiet: {…}, notifications: [rules]},
// which gives the project the name its messages show and its quiet hours:
//
//	5e3eef0679fa3700a0198a49:
//	  - id: rule-1
//	    isEnabled: true
//	    whatToReceive: SEEN_MORE
//	    threshold: 100
//	    thresholdPeriod: 60000
//	    channels:
//	      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:8080/hook", minPeriod: 0}
//
// Load reads the file only when it may have changed: when its size,
// modification time, change time or inode (device and number) differ from
// the last read, or the last read saw it changed less than racyWindow
// before, since an edit within one tick of the file system's clock leaves
// its times as they were. A file over MaxRulesFileBytes fails the load
// unread. One that cannot be parsed, or is empty, fails the load (so a
// half-written file never drops every rule: write "{}" for no rules;
// replace the file by renaming a new one over it).
// A project key that is not 24 hex digits, or a rule that does not fit the
// schema, is a Problem and left out; unknown fields are Problems that do not
// skip the rule.
//
// A rule document copied from MongoDB loads unchanged: its id may be _id,
// the Extended JSON wrappers mongoexport writes for the types of Hawk's
// rules ($oid, $numberInt, $numberLong, $numberDouble) are unwrapped, and
// Hawk's fields that Klaxon does not use are no unknown fields.
type FileSource struct {
	path string
	read func(path string, limit int64) ([]byte, error)
	now  func() time.Time

	mu    sync.Mutex
	last  Specs     // what the file held at the last Load, with its Digest
	stamp fileStamp // the file as last read; zero when it must be read again
}

// MaxRulesFileBytes bounds the rules file, so that a huge one cannot
// exhaust the worker's memory: 64 MiB holds some 200,000 rules.
const MaxRulesFileBytes = 64 << 20

// racyWindow is how recently a file may have changed for its stamp to be
// distrusted: above the coarsest time granularity of common file systems
// (1 s for ext3 and HFS+, 2 s for FAT) and small clock skew to a network
// file server.
const racyWindow = 3 * time.Second

// NewFileSource returns a source reading the YAML file at path.
func NewFileSource(path string) *FileSource {
	return &FileSource{path: path, read: readLimited, now: time.Now}
}

// Path is the file the source reads.
func (s *FileSource) Path() string {
	return s.path
}

// Load reads and decodes the file, or returns what the last Load did when
// the file's stamp says it is unchanged.
func (s *FileSource) Load(context.Context) (Specs, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, err := os.Stat(s.path)
	if err != nil {
		return Specs{}, fmt.Errorf("read rules file: %w", err)
	}
	stamp := stampOf(info)
	if s.stamp != (fileStamp{}) && stamp == s.stamp {
		return s.last, nil
	}
	if info.Size() > MaxRulesFileBytes {
		return Specs{}, fmt.Errorf("rules file %s is %d bytes, over the limit of %d MiB", s.path, info.Size(), MaxRulesFileBytes>>20)
	}
	data, err := s.read(s.path, MaxRulesFileBytes)
	if err != nil {
		return Specs{}, fmt.Errorf("rules file %s: %w", s.path, err)
	}
	// A stamp taken before the read vouches for what was read only if the
	// file did not change in the last ticks of its clock.
	if stamp.racy(s.now()) {
		stamp = fileStamp{}
	}
	digest := digestOf(data)
	if s.last.Digest == digest {
		s.stamp = stamp
		return s.last, nil
	}
	specs, err := parseRulesFile(data)
	if err != nil {
		return Specs{}, fmt.Errorf("rules file %s: %w", s.path, err)
	}
	specs.Digest = digest
	s.last, s.stamp = specs, stamp
	return specs, nil
}

// readLimited reads the file at path, failing when it holds more than
// limit bytes (it may have grown since it was measured).
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("over the limit of %d MiB", limit>>20)
	}
	return data, nil
}

// fileStamp is what a stat says about a file's content without reading it.
type fileStamp struct {
	size         int64
	mtime, ctime int64  // Unix nanoseconds; ctime 0 where the system does not say
	dev, ino     uint64 // 0 where the system does not say
}

func stampOf(info os.FileInfo) fileStamp {
	st := fileStamp{size: info.Size(), mtime: info.ModTime().UnixNano()}
	st.ctime, st.dev, st.ino = sysStamp(info)
	return st
}

// racy reports whether the file changed too recently, as of now, for the
// stamp to tell a later edit apart.
func (st fileStamp) racy(now time.Time) bool {
	recent := now.Add(-racyWindow).UnixNano()
	return st.mtime > recent || st.ctime > recent
}

// digestOf identifies content, for Specs.Digest.
func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// parseRulesFile decodes the YAML rules file data.
func parseRulesFile(data []byte) (Specs, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Specs{}, errors.New(redactYAML(err.Error()))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return Specs{}, errors.New(`the file is empty; write "{}" for no rules`)
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return Specs{}, fmt.Errorf("line %d: want a mapping from project id to a list of rules", root.Line)
	}
	specs := Specs{Projects: map[string][]rules.Spec{}, Lines: map[string][]int{}, Names: map[string]string{},
		Quiet: map[string]ProjectQuiet{}}
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, value := root.Content[i], root.Content[i+1]
		projectID := strings.ToLower(key.Value)
		if key.Kind != yaml.ScalarNode || !event.IsObjectID(projectID) {
			specs.Problems = append(specs.Problems, Problem{ProjectID: key.Value, Skipped: true, Line: key.Line,
				Reason: "project id must be 24 hex digits"})
			continue
		}
		if _, dup := specs.Projects[projectID]; dup {
			specs.Problems = append(specs.Problems, Problem{ProjectID: projectID, Skipped: true, Line: key.Line,
				Reason: "the project is listed again; only its first list is used"})
			continue
		}
		if value.Kind == yaml.MappingNode {
			var doc projectMapping
			var problems []Problem
			doc, value, problems = decodeProjectMapping(projectID, value)
			specs.Problems = append(specs.Problems, problems...)
			if doc.name != "" {
				specs.Names[projectID] = doc.name
			}
			if value == nil {
				continue
			}
			if doc.quiet != nil {
				specs.Quiet[projectID] = *doc.quiet
			}
		}
		list, lines, problems := decodeRuleList(projectID, value)
		specs.Problems = append(specs.Problems, problems...)
		specs.Projects[projectID] = list // may be empty: the project is known, with no rules
		specs.Lines[projectID] = lines
	}
	return specs, nil
}

// projectMapping is what a project given as a mapping says besides its
// rules.
type projectMapping struct {
	name  string
	quiet *ProjectQuiet // nil: none
}

// decodeProjectMapping reads a project given as a mapping, the shape of
// Hawk's project document: {name: …, quiet: …, notifications: [rules]},
// and an _id that, when there, must be the key's. It returns the name and
// quiet hours, and the rules' node, nil when the project is skipped.
func decodeProjectMapping(projectID string, node *yaml.Node) (projectMapping, *yaml.Node, []Problem) {
	var problems []Problem
	skip := func(line int, reason string) (projectMapping, *yaml.Node, []Problem) {
		return projectMapping{}, nil, append(problems, Problem{ProjectID: projectID, Skipped: true, Line: line, Reason: reason})
	}
	if mappingValue(node, "notifications") == nil {
		return skip(node.Line, "want a list of rules, or a mapping with notifications (and a name)")
	}
	var doc projectMapping
	var list *yaml.Node
	for i := 0; i+1 < len(node.Content); i += 2 {
		key, value := node.Content[i].Value, node.Content[i+1]
		switch key {
		case "name":
			if value.Kind != yaml.ScalarNode || value.ShortTag() == "!!null" {
				problems = append(problems, Problem{ProjectID: projectID, Line: value.Line,
					Reason: "name is not a string: ignored"})
				continue
			}
			doc.name = value.Value
		case "quiet":
			var p []Problem
			doc.quiet, p = decodeQuietNode(projectID, value)
			problems = append(problems, p...)
		case "notifications":
			list = value
		case "_id":
			if err := fromExtendedJSON(value); err != nil {
				return skip(value.Line, err.Error())
			}
			if value.Kind != yaml.ScalarNode || strings.ToLower(value.Value) != projectID {
				return skip(value.Line, "_id is not the project id it is listed under")
			}
		default:
			problems = append(problems, Problem{ProjectID: projectID, Line: node.Content[i].Line,
				Reason: fmt.Sprintf("unknown field %q ignored", key)})
		}
	}
	return doc, list, problems
}

// decodeQuietNode reads a project's quiet hours, nil for none (null); an
// unknown field in them is a Problem that does not skip them.
func decodeQuietNode(projectID string, node *yaml.Node) (*ProjectQuiet, []Problem) {
	if node.Kind == yaml.ScalarNode && node.ShortTag() == "!!null" {
		return nil, nil
	}
	var pq ProjectQuiet
	if err := node.Decode(&pq.Spec); err != nil {
		pq.Err = "quiet: " + redactYAML(err.Error())
		return &pq, nil
	}
	var issues fieldIssues
	issues.walk(node, reflect.TypeFor[quiet.Spec](), "quiet.")
	var problems []Problem
	for _, field := range issues.unknown {
		problems = append(problems, Problem{ProjectID: projectID, Line: field.line,
			Reason: fmt.Sprintf("unknown field %q ignored", field.path)})
	}
	return &pq, problems
}

// decodeRuleList decodes one project's list of rules, and returns the line
// of each rule decoded.
func decodeRuleList(projectID string, list *yaml.Node) ([]rules.Spec, []int, []Problem) {
	switch {
	case list.Kind == yaml.ScalarNode && list.Tag == "!!null":
		return nil, nil, nil
	case list.Kind != yaml.SequenceNode:
		return nil, nil, []Problem{{ProjectID: projectID, Skipped: true, Line: list.Line,
			Reason: "want a list of rules"}}
	}
	var specs []rules.Spec
	var lines []int
	var problems []Problem
	for i, node := range list.Content {
		// Before anything reads the id: a rule copied from MongoDB names
		// itself with _id, often as {$oid: …}.
		extErr := fromExtendedJSON(node)
		idErr := unifyID(node)
		ruleID := fmt.Sprintf("#%d", i)
		if id := mappingValue(node, "id"); id != nil && id.Kind == yaml.ScalarNode && strings.TrimSpace(id.Value) != "" {
			ruleID = strings.TrimSpace(id.Value)
		}
		problem := func(reason string) Problem {
			return Problem{ProjectID: projectID, RuleID: ruleID, Reason: reason, Skipped: true, Line: node.Line}
		}
		if node.Kind != yaml.MappingNode {
			problems = append(problems, problem("a rule must be a mapping"))
			continue
		}
		if err := cmp.Or(extErr, idErr); err != nil {
			problems = append(problems, problem(err.Error()))
			continue
		}
		var spec rules.Spec
		if err := node.Decode(&spec); err != nil {
			problems = append(problems, problem(redactYAML(err.Error())))
			continue
		}
		spec.ID = strings.TrimSpace(spec.ID)
		if spec.ID == "" {
			problems = append(problems, problem("rule has no id"))
			continue
		}
		var issues fieldIssues
		issues.walk(node, reflect.TypeFor[rules.Spec](), "")
		if len(issues.fractional) > 0 {
			problems = append(problems, problem(strings.Join(issues.fractional, ", ")+": want whole numbers"))
			continue
		}
		for _, field := range issues.unknown {
			if hawkOnlyField(field.path) {
				continue
			}
			problems = append(problems, Problem{ProjectID: projectID, RuleID: ruleID, Line: field.line,
				Reason: fmt.Sprintf("unknown field %q ignored", field.path)})
		}
		specs = append(specs, spec)
		lines = append(lines, node.Line)
	}
	return specs, lines, problems
}

// mappingValue returns the value of key in a mapping node, or nil.
func mappingValue(node *yaml.Node, key string) *yaml.Node {
	if node.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(node.Content); i += 2 {
		if node.Content[i].Value == key {
			return node.Content[i+1]
		}
	}
	return nil
}

// fieldIssues is what a rule's YAML holds that decoding it into
// rules.Spec would drop without an error, as dotted paths under a prefix.
type fieldIssues struct {
	// unknown are keys of mappings that the struct type does not declare
	// (by yaml tag). Map keys (channel names) are not fields:
	// rules.Compile checks them.
	unknown []unknownField
	// fractional are integer fields given a number with a fraction, and
	// that number: yaml.v3 cuts it (threshold 2.5 becomes 2, minPeriod 0.5
	// becomes 0), where a rule from MongoDB with the same number is skipped.
	fractional []string
}

// unknownField is a key a rule's struct does not declare, and its line.
type unknownField struct {
	path string
	line int
}

// walk collects the issues of node, decoded into a value of type t.
func (fi *fieldIssues) walk(node *yaml.Node, t reflect.Type, prefix string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// yaml.v3 decodes an alias (*name) as the node it names.
	for node.Kind == yaml.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	switch {
	case node.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.Type{}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if name != "-" {
				fields[name] = f.Type
			}
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			name := node.Content[i].Value
			if name == "<<" && node.Content[i].ShortTag() == "!!merge" {
				// A merge key (<<: *defaults, or a list of them) is no
				// field: yaml.v3 decodes the keys it brings as this
				// mapping's own.
				merged := node.Content[i+1]
				for merged.Kind == yaml.AliasNode && merged.Alias != nil {
					merged = merged.Alias
				}
				if merged.Kind == yaml.SequenceNode {
					for _, m := range merged.Content {
						fi.walk(m, t, prefix)
					}
				} else {
					fi.walk(merged, t, prefix)
				}
				continue
			}
			ft, ok := fields[name]
			if !ok {
				fi.unknown = append(fi.unknown, unknownField{prefix + name, node.Content[i].Line})
				continue
			}
			fi.walk(node.Content[i+1], ft, prefix+name+".")
		}
	case node.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(node.Content); i += 2 {
			fi.walk(node.Content[i+1], t.Elem(), prefix+node.Content[i].Value+".")
		}
	case node.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, item := range node.Content {
			fi.walk(item, t.Elem(), fmt.Sprintf("%s[%d].", strings.TrimSuffix(prefix, "."), i))
		}
	case node.Kind == yaml.ScalarNode && node.ShortTag() == "!!float" && t.Kind() == reflect.Int64:
		// A float literal is never an endpoint: the reason may quote it.
		var f float64
		if node.Decode(&f) == nil && f != math.Trunc(f) {
			fi.fractional = append(fi.fractional, strings.TrimSuffix(prefix, ".")+" "+node.Value)
		}
	}
}

// yamlQuoted matches the values yaml.v3 quotes in its errors ("cannot
// unmarshal !!str `http://...` into int64"): they may be the start of an
// endpoint.
var yamlQuoted = regexp.MustCompile("\\s*`[^`]*`")

func redactYAML(msg string) string {
	return yamlQuoted.ReplaceAllString(msg, "")
}

// hawkOnlyField reports whether a rule's field is one of Hawk's that Klaxon
// has no use for (who added the rule, whether Hawk made it): a rule copied
// from MongoDB carries them, and they are no typo to warn about.
func hawkOnlyField(field string) bool {
	return field == "uidAdded" || field == "autoAdded"
}

// unifyID lets a rule name itself as Hawk's documents do (_id) or as
// Klaxon's file always did (id): _id becomes id. Both are fine when they
// agree; when they differ, nobody can tell which was meant.
func unifyID(node *yaml.Node) error {
	if node.Kind != yaml.MappingNode {
		return nil
	}
	underscore, plain := -1, -1
	for i := 0; i+1 < len(node.Content); i += 2 {
		switch node.Content[i].Value {
		case "_id":
			underscore = i
		case "id":
			plain = i
		}
	}
	switch {
	case underscore < 0:
		return nil
	case plain < 0:
		node.Content[underscore].Value = "id"
		return nil
	}
	a, b := node.Content[underscore+1], node.Content[plain+1]
	if a.Kind != yaml.ScalarNode || b.Kind != yaml.ScalarNode || strings.TrimSpace(a.Value) != strings.TrimSpace(b.Value) {
		return fmt.Errorf("line %d: _id and id differ; give one of them", node.Line)
	}
	node.Content = slices.Delete(node.Content, underscore, underscore+2)
	return nil
}

// fromExtendedJSON rewrites, in place, the MongoDB Extended JSON wrappers
// that mongoexport writes for the BSON types of Hawk's rules into the plain
// YAML values they stand for: {$oid: "5e4f…"} (an ObjectId, in both of
// mongoexport's modes) becomes the string of its lower-case hex, as
// MongoSource names it; {$numberInt: "5"}, {$numberLong: "60000"} and
// {$numberDouble: "0.0"} (canonical mode; relaxed mode, mongoexport's
// default, writes plain numbers) become numbers. Other wrappers ($date,
// $binary, …) stand for types no rule field has: they are left as they
// are, and decoding reports them.
func fromExtendedJSON(node *yaml.Node) error {
	switch node.Kind {
	case yaml.SequenceNode:
		for _, n := range node.Content {
			if err := fromExtendedJSON(n); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		if len(node.Content) == 2 && node.Content[1].Kind == yaml.ScalarNode {
			if done, err := unwrap(node, node.Content[0].Value, node.Content[1].Value); done || err != nil {
				return err
			}
		}
		for i := 1; i < len(node.Content); i += 2 {
			if err := fromExtendedJSON(node.Content[i]); err != nil {
				return err
			}
		}
	}
	// Aliases point at nodes met (and rewritten) where they are anchored.
	return nil
}

// unwrap turns node, a mapping {wrapper: value}, into the scalar it stands
// for, and reports whether wrapper was one it knows. Errors never quote the
// value: it could be an endpoint put in the wrong place.
func unwrap(node *yaml.Node, wrapper, value string) (bool, error) {
	var tag string
	switch wrapper {
	case "$oid":
		if !event.IsObjectID(value) {
			return true, fmt.Errorf("line %d: $oid must be 24 hex digits", node.Line)
		}
		tag, value = "!!str", strings.ToLower(value)
	case "$numberInt", "$numberLong":
		if _, err := strconv.ParseInt(value, 10, 64); err != nil {
			return true, fmt.Errorf("line %d: %s is not an integer", node.Line, wrapper)
		}
		tag = "!!int"
	case "$numberDouble":
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return true, fmt.Errorf("line %d: $numberDouble is not a finite number", node.Line)
		}
		tag = "!!float"
	default:
		return false, nil
	}
	*node = yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value, Line: node.Line, Column: node.Column,
		Anchor: node.Anchor}
	return true, nil
}
