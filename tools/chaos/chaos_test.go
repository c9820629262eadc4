package main

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// docs/contract.md §4.5 under crashes: three worker processes on one queue, one of
// them SIGKILLed about every 300 ms and replaced, and every firing notified
// exactly once, but for the repeats that a kill between the provider's
// answer and Klaxon's record causes.
func TestExactlyOneNotificationUnderCrashes(t *testing.T) {
	bin := buildWorker(t)
	seed := uint64(time.Now().UnixNano())
	dir := t.TempDir()
	cfg := Config{
		Worker:    bin,
		Workers:   3,
		Events:    5000,
		Groups:    150,
		KillEvery: 300 * time.Millisecond,
		Rate:      500, // ten seconds of events, and of kills
		// KLAXON_TEST_CHAOS_FLIGHT runs the workers with that many batches
		// in flight (their default otherwise).
		BatchesInFlight: envInt(t, "KLAXON_TEST_CHAOS_FLIGHT", 0),
		BatchLinger:     os.Getenv("KLAXON_TEST_CHAOS_LINGER"), // likewise, KLAXON_BATCH_LINGER
		Seed:            seed,
		Timeout:         90 * time.Second,
		AMQPURL:         testenv.AMQPURL(t),
		RedisURL:        testenv.RedisURL(),
		Dir:             dir,
		Log:             slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	t.Logf("seed %d (go run ./tools/chaos -seed %d -events 5000 -groups 150 -rate 500 reproduces the events)", seed, seed)
	res, err := Run(context.Background(), cfg)
	if err != nil {
		dumpLogs(t, dir)
		t.Fatal(err)
	}
	var table bytes.Buffer
	printTable(&table, res)
	t.Logf("result:\n%s", table.String())
	t.Logf("repeats: %d (%d after a SIGKILL of the previous copy's sender before it could record it)", res.Repeats, res.RepeatsAfterKill)

	if res.Missed != 0 || res.Extra != 0 {
		t.Errorf("missed %d, extra %d: want none (samples: missed %v, extra %v)", res.Missed, res.Extra, res.Missing, res.Extras)
	}
	if res.Bad != 0 {
		t.Errorf("%d webhook bodies do not match their Idempotency-Key's firing", res.Bad)
	}
	if len(res.UnexpectedExits) > 0 {
		t.Errorf("workers exited without being killed: %v", res.UnexpectedExits)
	}
	if res.Unsettled != "" {
		t.Errorf("the work never drained: %s", res.Unsettled)
	}
	if res.Failed != 0 || res.Dead != 0 {
		t.Errorf("%d failed notifications, %d dead letters: want none", res.Failed, res.Dead)
	}
	if res.Repeats != res.RepeatsAfterKill {
		t.Errorf("%d of %d repeats not explained by a SIGKILL in the crash window: %+v", res.Repeats-res.RepeatsAfterKill, res.Repeats, res.Repeated)
	}
	// The repeats are explained by the workers' log lines: the checker
	// must find them for what live workers sent, in the log format the
	// worker writes today.
	if res.LogChecked == 0 || res.Unlogged != 0 {
		t.Errorf("%d of %d sends by workers never killed have no \"notification sent\" line the checker can read", res.Unlogged, res.LogChecked)
	}
	if !res.OK() && !t.Failed() {
		t.Errorf("the run is not OK: %+v", res)
	}
	// The run must have tested something.
	if res.Kills < 10 || res.Expected < 200 || res.GroupsKept < 100 {
		t.Errorf("a weak run: %d kills, %d expected notifications, %d groups kept", res.Kills, res.Expected, res.GroupsKept)
	}
	if t.Failed() {
		dumpLogs(t, dir)
	}
}

// The order check keeps exactly the groups whose firings do not depend on
// the order of processing, and catches the groups made to depend on it.
func TestPlanKeepsOrderIndependentGroups(t *testing.T) {
	dir := t.TempDir()
	rulesOf, err := writeRules(context.Background(), filepath.Join(dir, "rules.yaml"), ruleSpecs("http://127.0.0.1:1/hook"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := makePlan(7, "test", 20000, 400, rulesOf, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p.Kept == p.Groups || p.Kept < p.Groups*85/100 {
		t.Errorf("kept %d of %d groups: want most, but not all (one in twenty is made order-dependent)", p.Kept, p.Groups)
	}
	if len(p.Expected) < 3*p.Kept/2 {
		t.Errorf("%d firings expected from %d groups: too few to test much", len(p.Expected), p.Kept)
	}
	byRule := map[string]int{}
	for _, f := range p.Expected {
		byRule[f.RuleID]++
	}
	for _, list := range ruleSpecs("x") {
		for _, r := range list {
			if byRule[r.ID] == 0 {
				t.Errorf("rule %s never fires", r.ID)
			}
		}
	}

	// Kept groups fire the same in orders the plan did not try.
	groups := map[string][]message{}
	for _, m := range p.Messages {
		hash := groupOf(t, m)
		groups[hash] = append(groups[hash], m)
	}
	rng := rand.New(rand.NewPCG(99, 1))
	for hash, msgs := range groups {
		project := projectOf(t, msgs[0])
		var want []string
		for _, f := range p.Expected {
			if f.GroupHash == hash {
				want = append(want, f.ID)
			}
		}
		slices.Sort(want)
		for range 3 {
			order := slices.Clone(msgs)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			got, err := modelFirings(&group{project: project, hash: hash}, order, rulesOf[project])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), want) {
				t.Fatalf("group %s fires %v in another order, %v as planned", hash, ids(got), want)
			}
		}
	}
}

// The sink names the process behind a connection through the kernel, and
// says "gone" once nobody holds the client end.
func TestSocketOwner(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("sender lookup needs Linux")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client := s.RemoteAddr().(*net.TCPAddr).AddrPort()
	server := s.LocalAddr().(*net.TCPAddr).AddrPort()
	inode, err := tcpInode(client, server)
	if err != nil || inode == 0 {
		t.Fatalf("tcpInode = %d, %v", inode, err)
	}
	if got := socketOwners(map[int]string{os.Getpid(): "me"})[inode]; got != "me" {
		t.Errorf("owner of the client socket %q, want me", got)
	}
	c.Close()
	if inode, err := tcpInode(client, server); err == nil && inode != 0 {
		t.Errorf("closed socket still held: inode %d", inode)
	}
	if _, err := tcpInode(netip.MustParseAddrPort("127.0.0.1:1"), server); err == nil {
		t.Error("a connection that never existed was found")
	}
}

// buildWorker builds the worker binary, with the race detector when this
// test has it: the packages are then already compiled, and the workers are
// checked for races too.
func buildWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "klaxon-worker")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	start := time.Now()
	out, err := exec.Command("go", append(args, "github.com/klaxonhq/klaxon/cmd/worker")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built the worker (race %t) in %s", raceEnabled, time.Since(start).Round(100*time.Millisecond))
	return bin
}

// dumpLogs shows what the workers logged (warnings and errors).
func dumpLogs(t *testing.T, dir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "w*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil || len(data) == 0 {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		var lines []string
		for sc.Scan() && len(lines) < 20 {
			lines = append(lines, sc.Text())
		}
		t.Logf("%s:\n%s", filepath.Base(f), strings.Join(lines, "\n"))
	}
}

func groupOf(t *testing.T, m message) string {
	t.Helper()
	hm := decodeMessage(t, m)
	return hm.Event.GroupHash
}

func projectOf(t *testing.T, m message) string {
	t.Helper()
	return decodeMessage(t, m).ProjectID
}

func decodeMessage(t *testing.T, m message) event.Message {
	t.Helper()
	hm, err := event.Decode(m.Body)
	if err != nil {
		t.Fatal(err)
	}
	return hm
}

// testWriter sends the tool's progress log to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
