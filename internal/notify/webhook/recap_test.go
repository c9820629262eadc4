package webhook

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

// A recap's body is a digest with the quiet period on top, its times in
// UTC as every time of a body, and ruleId "" when it lists several rules.
func TestRecapBody(t *testing.T) {
	body, err := json.Marshal(Body(notifytest.Recap("boom", time.Date(2026, 1, 7, 23, 0, 0, 0, time.UTC))))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"type":"digest"`, `"id":"quiet-1"`, `"ruleId":""`, `"omitted":2`,
		`"quiet":{"since":"2026-01-07T21:00:00Z","until":"2026-01-08T06:00:00Z","timezone":"Europe/Berlin","firings":5,` +
			`"rules":[{"ruleId":"64ab00000000000000000001","firings":3,"stillAbove":["11dabb"]},` +
			`{"ruleId":"64ab00000000000000000002","firings":1,"stillAbove":[]}`, `"stillAbove":1}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("body %s\nlacks %s", body, want)
		}
	}
}
