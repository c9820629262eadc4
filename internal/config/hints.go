package config

import "fmt"

// RulesStoreHint says where rules are read from and what to change when
// that store does not answer: which MongoDB KLAXON_MONGO_URL names (without
// credentials), and that KLAXON_RULES_FILE reads a file instead. It follows
// a failed load in the worker's log, its /readyz and the tool's errors.
func (c Config) RulesStoreHint() string {
	if c.RulesFile != "" {
		return fmt.Sprintf("rules come from %s=%s", EnvRulesFile, c.RulesFile)
	}
	return fmt.Sprintf("rules come from MongoDB at %s=%s; check it, or set %s to read them from a YAML file",
		EnvMongoURL, redactURL(c.MongoURL), EnvRulesFile)
}
