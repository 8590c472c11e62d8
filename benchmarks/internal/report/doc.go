// Package report holds what the benchmark programs share about their
// figures: the Result of one measurement, its table and JSON-lines forms,
// a reader for JSON-lines files (ours and the NCCL peer script's), and the
// order statistics every program reports.
//
//	rs := []report.Result{{Bench: "transfer", Path: "raw-tcp", Size: 1 << 20, Metric: report.GBps, Value: 3.2}}
//	_ = report.WriteTable(os.Stdout, rs)
//	_ = report.WriteJSON(os.Stdout, rs) // {"bench":"transfer","path":"raw-tcp","size":1048576,"metric":"gbps","value":3.2}
//	back, _ := report.Read(f)          // also accepts nccl_sendrecv.py's {"peer":..,"bytes":..,"us":..,"GBps":..}
package report
