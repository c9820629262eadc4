package main

import "context"

func (a *app) testSend(ctx context.Context, args []string) int { return exitUsage }
