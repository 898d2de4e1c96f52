package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RouteRedisLogs sends what the go-redis client logs on its own (dial failures while a server
// is down, pool trouble) to log as warnings, instead of go-redis's default: plain
// "redis: ..." lines on stderr that break a service's JSON log. go-redis has one logger for
// the whole process, so a service calls this once, at start-up.
func RouteRedisLogs(log *slog.Logger) {
	redis.SetLogger(redisLog{log})
}

type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	l.log.WarnContext(ctx, "redis client", "detail", strings.TrimSpace(fmt.Sprintf(format, v...)))
}
