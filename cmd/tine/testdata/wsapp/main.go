// Command wsapp is a web app for the exposure tests: a page whose script
// opens a WebSocket back to the server, sends a word and shows the
// answer; the server writes what it received to a file.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/coder/websocket"
)

const page = `<!doctype html>
<html><head><title>waiting</title></head>
<body><div id="result">script did not run</div>
<script>
const ws = new WebSocket("ws://" + location.host + "/ws");
ws.onopen = () => ws.send("hello-from-browser");
ws.onmessage = (e) => {
  document.title = "ws " + e.data;
  document.getElementById("result").textContent = "ws " + e.data;
};
ws.onerror = () => { document.title = "ws error"; };
</script></body></html>
`

func main() {
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	out := flag.String("out", "/tmp/wsapp.result", "file that gets what the WebSocket received")
	flag.Parse()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, page)
	})
	http.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		_, msg, err := c.Read(context.Background())
		if err != nil {
			return
		}
		os.WriteFile(*out, append(msg, '\n'), 0o644)
		c.Write(context.Background(), websocket.MessageText, append([]byte("pong:"), msg...))
		c.Close(websocket.StatusNormalClosure, "")
	})
	log.Fatal(http.ListenAndServe(*addr, nil))
}
