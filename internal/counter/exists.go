package counter

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// HasState reports, for each (project, group) of groups, whether Redis
// holds a counting state for it: one round trip, an EXISTS a group.
func (e *Engine) HasState(ctx context.Context, groups [][2]string) ([]bool, error) {
	if len(groups) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.IntCmd, len(groups))
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, g := range groups {
			cmds[i] = p.Exists(ctx, GroupKey(e.prefix, g[0], g[1])+":s")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("look up %d groups' states: %w", len(groups), err)
	}
	has := make([]bool, len(groups))
	for i, c := range cmds {
		has[i] = c.Val() > 0
	}
	return has, nil
}
