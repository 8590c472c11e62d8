package tracing

import "time"

// FromEnvFunc is fromEnv for tests.
var FromEnvFunc = fromEnv

// ExporterConfigFromEnv is exporterConfig for tests.
var ExporterConfigFromEnv = exporterConfig

// DecodePartialSuccess is decodePartialSuccess for tests.
var DecodePartialSuccess = decodePartialSuccess

// SetRetryBase sets the first wait before a retry.
func (c *ExporterConfig) SetRetryBase(d time.Duration) { c.retryBase = d }
