package crashpoint

import (
	"encoding/json"
	"net"
	"net/http"
	"time"
)

// Serve starts a hook on a loopback port and returns its URL (for HookEnv) and a function
// that stops it. Each Visit is passed to visit, and the process that made it waits until
// visit returns: visit SIGKILLs the process to crash it there, or returns to let it go on.
func Serve(visit func(Visit)) (url string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v Visit
		if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&v) != nil {
			http.Error(w, "POST a crashpoint.Visit", http.StatusBadRequest)
			return
		}
		visit(v)
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(l)
	return "http://" + l.Addr().String() + "/crashpoint", func() { srv.Close() }, nil
}
