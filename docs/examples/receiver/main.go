// Command receiver is the webhook receiver of the README's "Your first
// rule": it prints every JSON body POSTed to 127.0.0.1:8099, indented, and
// answers 204.
package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"
)

func main() {
	log.Println("receiver: listening on http://127.0.0.1:8099/")
	err := http.ListenAndServe("127.0.0.1:8099", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var out bytes.Buffer
		if json.Indent(&out, body, "", "  ") != nil {
			out.Write(body)
		}
		out.WriteByte('\n')
		os.Stdout.Write(out.Bytes())
		w.WriteHeader(http.StatusNoContent)
	}))
	log.Fatal(err)
}
