package main

import "syscall"

// procAttr makes a worker die with the tool, so an interrupted run leaves no
// process behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
