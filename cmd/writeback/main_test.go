package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigDefaultsAndEnv(t *testing.T) {
	cfg, err := parseConfig(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != "127.0.0.1:50053" || cfg.storePath != "./handoff-data/writeback.db" ||
		cfg.artifacts != "./handoff-data/artifacts" || cfg.webhookURL != "" ||
		cfg.pendingTTL != 2*time.Minute || cfg.receiptTTL != 0 {
		t.Errorf("defaults %+v", cfg)
	}
	cfg, err = parseConfig([]string{"--listen", ":7000"}, envOf(map[string]string{
		"HANDOFF_WRITEBACK_LISTEN": "0.0.0.0:6000",
		"HANDOFF_STORE":            "/data/wb.db",
		"HANDOFF_ARTIFACTS":        "/data/art",
		"HANDOFF_WEBHOOK_URL":      "https://hooks.example.com/x",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != ":7000" || cfg.storePath != "/data/wb.db" || cfg.artifacts != "/data/art" ||
		cfg.webhookURL != "https://hooks.example.com/x" {
		t.Errorf("flags over env %+v", cfg)
	}
}

func TestParseConfigBadValuesNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		flag string
	}{
		{[]string{"--listen", "nope"}, nil, "--listen"},
		{[]string{"--listen", "127.0.0.1:99999"}, nil, "--listen"},
		{nil, map[string]string{"HANDOFF_WRITEBACK_LISTEN": "localhost"}, "--listen"},
		{[]string{"--webhook-url", "ftp://x"}, nil, "--webhook-url"},
		{nil, map[string]string{"HANDOFF_WEBHOOK_URL": "not a url"}, "--webhook-url"},
		{[]string{"--pending-ttl", "soon"}, nil, "--pending-ttl"},
		{[]string{"--receipt-ttl", "-1h"}, nil, "--receipt-ttl"},
		{[]string{"--store", ""}, nil, "--store"},
		{[]string{"--webhook-url", "http://h", "--webhook-timeout", "2m"}, nil, "--webhook-timeout"},
	}
	for _, tc := range cases {
		_, err := parseConfig(tc.args, envOf(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%v %v: err %v, want it to name %s", tc.args, tc.env, err, tc.flag)
		}
	}
}
