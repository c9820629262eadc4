package evaluator

import (
	"strconv"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// regressionCooldown keeps a resolution's rule quiet for a group after it
// fired: far longer than ONLY_NEW's day, so that a group left marked
// resolved while it keeps happening is told about once, not daily.
const regressionCooldown = 30 * 24 * time.Hour

// regression is what a derived rule stands for: the rule, and the
// resolution (the mark's Unix seconds) it fires once for.
type regression struct {
	rule     *rules.Rule
	resolved int64
}

// regressions maps the batch's derived rules to what they stand for. A
// derived rule is the ONLY_NEW rule under the ID "<rule>~resolved-<mark>":
// the counter keeps its state apart from the rule's own, so its
// once-per-cooldown firing is once per resolution, and a new resolution
// (a new mark) starts afresh.
type regressions struct {
	of      map[*rules.Rule]regression
	derived map[string]*rules.Rule // by derived ID
}

func (regs *regressions) lookup(r *rules.Rule) (regression, bool) {
	reg, ok := regs.of[r]
	return reg, ok
}

// add appends to dst the derived rules of the ONLY_NEW rules that a new
// event with this title would match.
func (regs *regressions) add(m *rules.Matcher, title string, resolved int64, dst []*rules.Rule) []*rules.Rule {
	for _, r := range m.Match(title, true, nil) {
		if !r.OnlyNew {
			continue
		}
		id := r.ID + "~resolved-" + strconv.FormatInt(resolved, 10)
		derived := regs.derived[id]
		if derived == nil {
			if regs.of == nil {
				regs.of, regs.derived = make(map[*rules.Rule]regression), make(map[string]*rules.Rule)
			}
			c := *r
			c.ID, c.Cooldown = id, regressionCooldown
			derived = &c
			regs.of[derived], regs.derived[id] = regression{rule: r, resolved: resolved}, derived
		}
		dst = append(dst, derived)
	}
	return dst
}

// kind is a firing's notification type.
func kind(o *counter.Outcome, regs *regressions) string {
	switch _, regressed := regs.lookup(o.Rule); {
	case regressed:
		return notify.TypeRegressed
	case o.Rule.OnlyNew:
		return notify.TypeNew
	}
	return notify.TypeThreshold
}
