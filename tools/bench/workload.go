package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// workload is the generated traffic of one run: projects and their rules,
// groups, and the events of the queue, all derived from the seed.
type workload struct {
	projects []string // 24-hex project ids
	probe    string   // the latency probe's project: one ONLY_NEW rule, no filters
	groups   int
	titles   []string // per group
	hashes   []string // per group: a sha256 hex like Hawk's groupHash
	order    []int    // group of each event of the queue, in queue order
	isNew    []bool   // whether each event is its group's first
	rules    int      // per project
	// threshold of the lowest SEEN_MORE rule; others are multiples.
	threshold int64
	// idless: messages without repetitionId or isNew, rules of idlessSpecs.
	idless bool
	mean   float64 // events per group
}

// newWorkload generates events over groups (each group once at least, the
// rest Zipf-distributed: a few hot groups, a long tail), shuffled.
func newWorkload(o options) *workload {
	rng := rand.New(rand.NewPCG(uint64(o.seed), 0x6b6c61786f6e))
	w := &workload{groups: o.groups, rules: o.rules, threshold: o.threshold}
	for p := range o.projects {
		w.projects = append(w.projects, objectID(o.seed, "project", p))
	}
	w.probe = objectID(o.seed, "probe", 0)
	bases := titleBases()
	w.titles = make([]string, o.groups)
	w.hashes = make([]string, o.groups)
	for g := range o.groups {
		w.titles[g] = fmt.Sprintf("%s [%d]", bases[g%len(bases)], g)
		w.hashes[g] = hexHash(o.seed, "group", g)
	}
	w.order = make([]int, 0, o.events)
	if o.workload == "idless" {
		w.idless, w.mean = true, float64(o.events)/float64(o.groups)
		w.order = idlessOrder(rng, o.events, o.groups)
		w.isNew = make([]bool, len(w.order))
		return w
	}
	for g := 0; g < o.groups && len(w.order) < o.events; g++ {
		w.order = append(w.order, g)
	}
	if rest := o.events - len(w.order); rest > 0 {
		z := rand.NewZipf(rand.New(rand.NewPCG(uint64(o.seed), 1)), 1.1, 1, uint64(o.groups-1))
		for range rest {
			w.order = append(w.order, int(z.Uint64()))
		}
	}
	rng.Shuffle(len(w.order), func(i, j int) { w.order[i], w.order[j] = w.order[j], w.order[i] })
	// A group's first event is new, as Hawk's grouper says, for the
	// groups that are new (-new); the others existed before the run.
	seen := make([]bool, o.groups)
	w.isNew = make([]bool, len(w.order))
	newGroups := int(o.newFraction * float64(o.groups))
	for i, g := range w.order {
		w.isNew[i] = !seen[g] && g < newGroups
		seen[g] = true
	}
	return w
}

// idlessOrder draws each of events from groups, one in a hundred of them
// (at least one) four times as likely as the others, in random order.
func idlessOrder(rng *rand.Rand, events, groups int) []int {
	busy := rng.Perm(groups)[:max(groups/100, 1)]
	order := make([]int, events)
	for i := range order {
		x := rng.IntN(groups + 3*len(busy))
		if x >= groups {
			x = busy[(x-groups)/3]
		}
		order[i] = x
	}
	return order
}

// project is the project a group belongs to.
func (w *workload) project(group int) string { return w.projects[group%len(w.projects)] }

// hawkMessage is the message Hawk's grouper puts on the notifier queue.
type hawkMessage struct {
	ProjectID string    `json:"projectId"`
	Event     hawkEvent `json:"event"`
}

type hawkEvent struct {
	Title        string  `json:"title"`
	GroupHash    string  `json:"groupHash"`
	IsNew        bool    `json:"isNew"`
	RepetitionID *string `json:"repetitionId"`
}

// body is event i of the queue in round r: rounds differ by repetitionId,
// so a later round's events are new messages, not duplicates.
func (w *workload) body(round, i int) []byte {
	g := w.order[i%len(w.order)]
	if w.idless {
		// Neither repetitionId (null or not) nor isNew: a message as a
		// producer other than Hawk sends it, the same at every round.
		return marshal(idlessMessage{ProjectID: w.project(g), Event: idlessEvent{Title: w.titles[g], GroupHash: w.hashes[g]}})
	}
	m := hawkMessage{ProjectID: w.project(g), Event: hawkEvent{Title: w.titles[g], GroupHash: w.hashes[g]}}
	if round == 0 && w.isNew[i] {
		m.Event.IsNew = true // Hawk sends no repetition with a new group
	} else {
		rep := fmt.Sprintf("%08x%016x", round, i)
		m.Event.RepetitionID = &rep
	}
	return marshal(m)
}

// idlessMessage is a message without an identity: no repetitionId.
type idlessMessage struct {
	ProjectID string      `json:"projectId"`
	Event     idlessEvent `json:"event"`
}

type idlessEvent struct {
	Title     string `json:"title"`
	GroupHash string `json:"groupHash"`
}

// groupHash is the groupHash of event i of the queue.
func (w *workload) groupHash(i int) string { return w.hashes[w.order[i%len(w.order)]] }

// marshal encodes a message as Hawk (Node.js) does: without escaping <, >
// and & as encoding/json would.
func marshal(m any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // structs of plain strings and bools: cannot fail
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// probeBody is latency probe n: a new group of the probe project, so its
// ONLY_NEW rule fires for every probe; the repetitionId names the probe and
// comes back in the webhook body.
func (w *workload) probeBody(run string, n int) []byte {
	rep := probeID(run, n)
	m := hawkMessage{ProjectID: w.probe, Event: hawkEvent{
		Title: "Error: latency probe", GroupHash: probeGroup(run, n), IsNew: true, RepetitionID: &rep,
	}}
	return marshal(m)
}

// probeGroup is latency probe n's groupHash: a new group every probe.
func probeGroup(run string, n int) string { return hexHash(0, run, n) }

func probeID(run string, n int) string { return fmt.Sprintf("probe-%s-%d", run, n) }

// parseProbeID returns the run and number of a probe's repetitionId.
func parseProbeID(s string) (run string, n int, ok bool) {
	rest, found := strings.CutPrefix(s, "probe-")
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return "", 0, false
	}
	if _, err := fmt.Sscanf(rest[i+1:], "%d", &n); err != nil {
		return "", 0, false
	}
	return rest[:i], n, true
}

// ruleSpecs are a project's rules: mostly SEEN_MORE with thresholds high
// enough that only hot groups fire, some ONLY_NEW for database errors.
//
//	k%4 == 0: SEEN_MORE threshold T per minute, every title
//	k%4 == 1: SEEN_MORE "error" (most titles), windows 2T/1 min and 10T/10 min
//	k%4 == 2: SEEN_MORE excluding "staging", 10T per hour
//	k%4 == 3: ONLY_NEW "database" (one title in twenty)
func (w *workload) ruleSpecs(endpoint string) []rules.Spec {
	webhook := map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: endpoint}}
	if w.idless {
		return w.idlessSpecs(webhook)
	}
	t := w.threshold
	specs := make([]rules.Spec, w.rules)
	for k := range specs {
		s := rules.Spec{ID: fmt.Sprintf("rule-%d", k), IsEnabled: true, Channels: webhook}
		switch k % 4 {
		case 0:
			s.WhatToReceive, s.Threshold, s.ThresholdPeriod = rules.SeenMore, t, 60_000
		case 1:
			s.WhatToReceive, s.Including = rules.SeenMore, []string{"error"}
			s.Windows = []rules.WindowSpec{{Threshold: 2 * t, Period: 60_000}, {Threshold: 10 * t, Period: 600_000}}
		case 2:
			s.WhatToReceive, s.Excluding = rules.SeenMore, []string{"staging"}
			s.Threshold, s.ThresholdPeriod = 10*t, 3_600_000
		case 3:
			s.WhatToReceive, s.Including = rules.OnlyNew, []string{"database"}
		}
		specs[k] = s
	}
	return specs
}

// idlessSpecs are the idless workload's rules: SEEN_MORE on every title,
// periods 1 h and 1 day in turn, thresholds from 1.5 to 3.5 × the mean
// events per group, so that the busy groups fire and the others rarely.
func (w *workload) idlessSpecs(webhook map[string]rules.ChannelSpec) []rules.Spec {
	specs := make([]rules.Spec, w.rules)
	for k := range specs {
		factor := 1.5
		if w.rules > 1 {
			factor += 2 * float64(k) / float64(w.rules-1)
		}
		period := int64(3_600_000)
		if k%2 == 1 {
			period = 86_400_000
		}
		specs[k] = rules.Spec{ID: fmt.Sprintf("rule-%d", k), IsEnabled: true, Channels: webhook, WhatToReceive: rules.SeenMore,
			Threshold: max(int64(math.Ceil(factor*w.mean)), 1), ThresholdPeriod: period}
	}
	return specs
}

// rulesYAML is the KLAXON_RULES_FILE of the run: every project's rules,
// and the probe project's one ONLY_NEW rule.
func (w *workload) rulesYAML(endpoint string) ([]byte, error) {
	doc := make(map[string][]rules.Spec, len(w.projects)+1)
	specs := w.ruleSpecs(endpoint)
	for _, p := range w.projects {
		doc[p] = specs
	}
	doc[w.probe] = []rules.Spec{{
		ID: "probe", IsEnabled: true, WhatToReceive: rules.OnlyNew,
		Channels: map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: endpoint}},
	}}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode rules file: %w", err)
	}
	return b, nil
}

func objectID(seed int64, kind string, n int) string { return hexHash(seed, kind, n)[:24] }

func hexHash(seed int64, kind string, n int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d", seed, kind, n))
	return hex.EncodeToString(sum[:])
}

// titleBases are the error titles events carry. One in twenty mentions the
// database, the filter of the ONLY_NEW rules, so those fire rarely.
func titleBases() []string {
	return []string{
		"TypeError: Cannot read properties of undefined (reading 'id')",
		"ReferenceError: user is not defined",
		"Error: Request failed with status code 502",
		"TypeError: x.map is not a function",
		"RangeError: Maximum call stack size exceeded",
		"Error: connect ECONNREFUSED 10.0.0.7:443",
		"SyntaxError: Unexpected token < in JSON at position 0",
		"Error: timeout of 30000ms exceeded",
		"TypeError: Failed to fetch",
		"Error: ENOENT: no such file or directory",
		"UnhandledPromiseRejection: staging smoke test failed",
		"TypeError: null is not an object (evaluating 'el.style')",
		"Error: Network Error",
		"Error: socket hang up",
		"TypeError: Assignment to constant variable.",
		"Error: Invalid hook call",
		"ChunkLoadError: Loading chunk 7 failed",
		"AbortError: The user aborted a request",
		"Error: Rate limit exceeded",
		"QueryFailedError: database deadlock detected",
	}
}
