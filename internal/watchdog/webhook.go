package watchdog

import (
	"context"
	"net/http"

	"github.com/klaxonhq/klaxon/internal/notify"
)

// Webhook POSTs alerts as JSON to URL (KLAXON_OPERATOR_WEBHOOK). The URL
// is the operator's own, so the endpoint guard that keeps rules' endpoints
// off private networks does not apply; redirects are still not followed,
// and errors never name the URL, which may hold a token.
type Webhook struct {
	URL    string
	Client *http.Client // nil: http.DefaultClient
}

// Notify sends a; any failure is an error (the watchdog tries again at
// its next look).
func (h *Webhook) Notify(ctx context.Context, a Alert) error {
	_, err := notify.PostJSON(ctx, h.Client, "operator webhook", h.URL, nil, a)
	return err
}
