// Package metrics exports a tensorferry node's counters as Prometheus
// metrics and serves them over HTTP.
//
//	srv, err := metrics.Serve(ctx, ":9464", metrics.Options{}, node)
//	...
//	defer srv.Close()
//
// serves /metrics (and /debug/pprof/ with Options.Pprof) until ctx is
// done. NewCollector gives the collector alone, for a registry of one's
// own. The collector reads the node's counters (actor.Node.Stats) at
// scrape time: the message and transfer paths keep their atomic counters
// and pay nothing more for being scraped.
//
// Every series has the label node (a process may run several nodes). The
// families, by Prometheus' conventions:
//
//	tensorferry_messages_sent_total                counter
//	tensorferry_messages_received_total            counter
//	tensorferry_dead_letters_total                 counter   messages to absent actors
//	tensorferry_delivery_failures_total            counter
//	tensorferry_tensors_exported_total             counter
//	tensorferry_transfers_total                    counter   channel, direction (in|out)
//	tensorferry_transfer_bytes_total               counter   channel, direction
//	tensorferry_transfer_duration_seconds          histogram channel (fetches: in)
//	tensorferry_transfer_failures_total            counter   reason
//	tensorferry_inbox_refused_total                counter
//	tensorferry_reader_deliveries_total            counter   fetched and delivered on the reader
//	tensorferry_regcache_hits_total                counter   cache
//	tensorferry_regcache_misses_total              counter   cache
//	tensorferry_regcache_evictions_total           counter   cache
//	tensorferry_regcache_invalidations_total       counter   cache
//	tensorferry_regcache_registered_bytes          gauge     cache
//	tensorferry_regcache_entries                   gauge     cache
//	tensorferry_leases_outstanding                 gauge
//	tensorferry_lent_bytes                         gauge
//	tensorferry_receive_budget_bytes               gauge
//	tensorferry_receive_budget_in_use_bytes        gauge
//	tensorferry_receive_budget_waiting_messages    gauge
//	tensorferry_peer_receive_budget_in_use_bytes   gauge     peer (Options.PeerLabels only)
//	tensorferry_credits_in_use                     gauge
//	tensorferry_credit_waits_total                 counter
//	tensorferry_credit_wait_seconds_total          counter
//	tensorferry_relay_served_total                 counter
//	tensorferry_relay_fetched_total                counter
//	tensorferry_relay_fallbacks_total              counter
//	tensorferry_relay_pushed_total                 counter
//	tensorferry_peers_up                           gauge
//	tensorferry_peer_up                            gauge     peer (Options.PeerLabels only)
//	tensorferry_node_down_total                    counter
//	tensorferry_connections                        gauge     purpose (control|data), transport
//
// Direction "in" counts what was fetched into the node, on every channel;
// "out" what the node served from its exports, on the channels in which
// the owner takes part (staging, one transfer per range request): local,
// ipc and verbs are one-sided and counted by the fetcher only. The
// latency buckets are transfer.LatencyBounds (10 µs to 60 s). With
// Options.PeerLabels the transfer families and tensorferry_credits_in_use
// get a peer label too (the owner fetched from; empty for "out").
//
// The Go runtime's (go_*) and the process' (process_*) collectors are
// served beside them.
//
// A Grafana dashboard of these families is grafana/tensorferry.json;
// `ferry top` shows them live in a terminal.
package metrics
