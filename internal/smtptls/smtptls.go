// Package smtptls names the ways a connection to an SMTP server may be
// secured (KLAXON_SMTP_TLS), and the hosts a password may reach in clear:
// the email channel connects by them, and config checks the operator's
// choice against them before anything starts, without either importing
// the other.
package smtptls

// Mode is how the connection to the SMTP server is secured.
type Mode string

const (
	// None is plain SMTP, even when the server offers STARTTLS.
	None Mode = "none"
	// StartTLS upgrades with STARTTLS and fails when the server does not
	// offer it, rather than send in clear.
	StartTLS Mode = "starttls"
	// Implicit speaks TLS from the first byte (port 465).
	Implicit Mode = "tls"
)

// IsLocalhost is net/smtp's test for a server it will send a password to in
// clear.
func IsLocalhost(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}
