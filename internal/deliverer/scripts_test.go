package deliverer

import (
	"testing"
	"time"
)

// A script's reply of another shape (a script of another version, a proxy
// in the way) is an error that holds the batch, never a panic or a guess.
func TestScriptRepliesDecodedOrRefused(t *testing.T) {
	for _, r := range [][]int64{nil, {}, {0, 1}, {1}, {2, 5}, {3, 0, 0}, {1, -1, 0}, {2, 0, 2}} {
		if got, err := decodeGate(r); err == nil {
			t.Errorf("decodeGate(%v) = %+v, want an error", r, got)
		}
	}
	if got, err := decodeGate([]int64{2, 1500, 1}); err != nil || got.code != gateFlushIn || got.flushIn != 1500*time.Millisecond || !got.omitted {
		t.Errorf("decodeGate({2, 1500, 1}) = %+v, %v", got, err)
	}

	for _, r := range [][]any{nil, {}, {"0"}, {int64(7)}, {int64(1)}, {int64(1), "5"}, {int64(2), int64(0)},
		{int64(0), "#"}, {int64(0), "n1", int64(3)}, {int64(3), "#omitted", "many"}} {
		if got, err := decodeFlush(r); err == nil {
			t.Errorf("decodeFlush(%v) = %+v, want an error", r, got)
		}
	}
	got, err := decodeFlush([]any{int64(0), "n1", "{job}", "#", "4", "#n", "1", "#omitted", "2"})
	if err != nil || got.code != flushTaken || got.generation != "4" || got.omitted != 2 || len(got.jobs) != 1 || got.jobs[0] != "{job}" {
		t.Errorf("decodeFlush(taken) = %+v, %v", got, err)
	}
	if got, err := decodeFlush([]any{int64(1), int64(250)}); err != nil || got.wait != 250*time.Millisecond {
		t.Errorf("decodeFlush(too early) = %+v, %v", got, err)
	}

	if _, err := decodeHold(2); err == nil {
		t.Error("decodeHold(2) is not an error")
	}
}
