package main

import (
	"context"
	"fmt"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	f, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: "127.0.0.1:27017"},
		Handler:  "sqlite",
		SQLiteURL: "file:/tmp/ferret/",
	})
	fmt.Println(f, err)
	_ = context.Background()
}
