package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// MongoSource reads rules from MongoDB in Hawk's schema: collection
// "projects", one document per project, {_id: ObjectId, notifications:
// [rule, …]}, each rule a document with an ObjectId _id and the fields of
// rules.Spec. Numbers may be stored as int32, int64 or whole doubles; other
// fields are ignored.
type MongoSource struct {
	client   *mongo.Client
	projects *mongo.Collection

	mu   sync.Mutex
	last Specs // what the last Load read, with its Digest
}

// NewMongoSource returns a source reading database at url. The database is
// config.Config.MongoDatabase, which config reads from the URL's path
// (Hawk's "hawk" when it names none): the URL is interpreted in one place.
// It does not connect yet: the first Load or Ping does.
func NewMongoSource(url, database string) (*MongoSource, error) {
	client, err := mongo.Connect(options.Client().ApplyURI(url).SetAppName("klaxon"))
	if err != nil {
		return nil, fmt.Errorf("MongoDB client: %w", err)
	}
	return &MongoSource{client: client, projects: client.Database(database).Collection("projects")}, nil
}

// Database is the name of the database the source reads.
func (s *MongoSource) Database() string {
	return s.projects.Database().Name()
}

// Ping checks that MongoDB answers, for readiness probes.
func (s *MongoSource) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx, readpref.PrimaryPreferred()); err != nil {
		return fmt.Errorf("ping MongoDB: %w", err)
	}
	return nil
}

// Close disconnects from MongoDB.
func (s *MongoSource) Close(ctx context.Context) error {
	if err := s.client.Disconnect(ctx); err != nil {
		return fmt.Errorf("disconnect from MongoDB: %w", err)
	}
	return nil
}

// Load reads the rules of every project that has any. Only _id, name,
// quiet and notifications are fetched: a Hawk project holds secrets of its own (its
// integration token) that Klaxon has no use for.
func (s *MongoSource) Load(ctx context.Context) (Specs, error) {
	filter := bson.D{{Key: "notifications.0", Value: bson.D{{Key: "$exists", Value: true}}}}
	projection := bson.D{{Key: "notifications", Value: 1}, {Key: "name", Value: 1}, {Key: "quiet", Value: 1}}
	cursor, err := s.projects.Find(ctx, filter, options.Find().SetProjection(projection))
	if err != nil {
		return Specs{}, fmt.Errorf("find projects in %s.%s: %w", s.Database(), s.projects.Name(), err)
	}
	// Read every document first and decode only if something changed.
	var docs []bson.Raw
	hash := sha256.New()
	for cursor.Next(ctx) {
		doc := slices.Clone(cursor.Current) // the cursor reuses its buffer
		hash.Write(doc)
		docs = append(docs, doc)
	}
	err = cursor.Err()
	if closeErr := cursor.Close(context.WithoutCancel(ctx)); err == nil {
		err = closeErr
	}
	if err != nil {
		return Specs{}, fmt.Errorf("read projects from %s.%s: %w", s.Database(), s.projects.Name(), err)
	}
	digest := hex.EncodeToString(hash.Sum(nil))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.Digest == digest {
		return s.last, nil
	}
	specs := Specs{Projects: map[string][]rules.Spec{}, Names: map[string]string{}, Quiet: map[string]ProjectQuiet{}, Digest: digest}
	for _, doc := range docs {
		projectID, ruleSpecs, problems := decodeProject(doc)
		specs.Problems = append(specs.Problems, problems...)
		if projectID != "" && len(ruleSpecs) > 0 {
			specs.Projects[projectID] = ruleSpecs
			// A name of another type is no name: messages show the id.
			if name, ok := doc.Lookup("name").StringValueOK(); ok && name != "" {
				specs.Names[projectID] = name
			}
			if pq, ok := decodeQuiet(doc.Lookup("quiet")); ok {
				specs.Quiet[projectID] = pq
			}
		}
	}
	s.last = specs
	return specs, nil
}

// decodeQuiet reads a project's quiet hours (Klaxon's extension of Hawk's
// project document); ok false when it has none.
func decodeQuiet(v bson.RawValue) (ProjectQuiet, bool) {
	if v.Type == 0 || v.Type == bson.TypeNull {
		return ProjectQuiet{}, false
	}
	var pq ProjectQuiet
	if err := v.Unmarshal(&pq.Spec); err != nil {
		// The driver names the field and the BSON type, not the value.
		pq.Err = "decode quiet: " + err.Error()
	}
	return pq, true
}

// decodeProject reads one project document: its id (empty when unusable),
// the rules that could be decoded, and a Problem for each that could not.
func decodeProject(doc bson.Raw) (string, []rules.Spec, []Problem) {
	idValue := doc.Lookup("_id")
	oid, ok := idValue.ObjectIDOK()
	if !ok {
		return "", nil, []Problem{{ProjectID: idValue.String(), Skipped: true,
			Reason: fmt.Sprintf("project _id is a BSON %s, not an ObjectId", idValue.Type)}}
	}
	projectID := oid.Hex()
	list, ok := doc.Lookup("notifications").ArrayOK()
	if !ok {
		return "", nil, []Problem{{ProjectID: projectID, Skipped: true, Reason: "notifications is not an array"}}
	}
	values, err := list.Values()
	if err != nil {
		return "", nil, []Problem{{ProjectID: projectID, Skipped: true, Reason: "notifications: " + err.Error()}}
	}
	var specs []rules.Spec
	var problems []Problem
	for i, v := range values {
		spec, err := decodeRule(v)
		if err != nil {
			ruleID := spec.ID
			if ruleID == "" {
				ruleID = fmt.Sprintf("#%d", i)
			}
			problems = append(problems, Problem{ProjectID: projectID, RuleID: ruleID, Reason: err.Error(), Skipped: true})
			continue
		}
		if spec.ID == "" {
			problems = append(problems, Problem{ProjectID: projectID, RuleID: fmt.Sprintf("#%d", i),
				Reason: "rule has no _id", Skipped: true})
			continue
		}
		specs = append(specs, spec)
	}
	return projectID, specs, problems
}

// decodeRule decodes one element of notifications. On error the returned
// spec carries the rule's id when that much could be read.
func decodeRule(v bson.RawValue) (rules.Spec, error) {
	doc, ok := v.DocumentOK()
	if !ok {
		return rules.Spec{}, fmt.Errorf("rule is a BSON %s, not a document", v.Type)
	}
	var spec rules.Spec
	switch id := doc.Lookup("_id"); id.Type {
	case bson.TypeObjectID:
		spec.ID = id.ObjectID().Hex()
	case bson.TypeString:
		spec.ID = strings.TrimSpace(id.StringValue())
	case 0: // missing: the caller reports it
	default:
		return rules.Spec{}, fmt.Errorf("rule _id is a BSON %s, not an ObjectId", id.Type)
	}
	id := spec.ID
	if err := bson.Unmarshal(doc, &spec); err != nil {
		// The driver's message names the field and the BSON type, never
		// the value, so it holds no endpoint.
		return rules.Spec{ID: id}, fmt.Errorf("decode rule: %w", err)
	}
	spec.ID = id
	return spec, nil
}
