package httpserve

import (
	"context"
	"log/slog"
	"net/http"
)

// Runner is Run as a part that runs until ctx ends: h served on addr, or
// nothing when addr is "" (the endpoint is off).
func Runner(addr string, h http.Handler, l Limits, webConfig, name string, log *slog.Logger) func(context.Context) {
	return func(ctx context.Context) {
		if addr != "" {
			Run(ctx, addr, h, l, webConfig, name, log)
		}
	}
}
