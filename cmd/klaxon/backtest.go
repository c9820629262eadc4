package main

import "context"

func (a *app) backtest(ctx context.Context, args []string) int { return exitUsage }
