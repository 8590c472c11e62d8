// Command plot draws bandwidth against message size, one line per path,
// from the JSON lines the benchmark programs print (--json, or
// benchmarks/gpu's --out DIR/gpu.jsonl) and from the output of
// ../shared/peers/nccl_sendrecv.py, whose table lines are skipped.
//
//	go run ./benchmarks/transfer --json > transfer.jsonl
//	go run ./benchmarks/plot --bench transfer --in transfer.jsonl --out transfer.svg
//	go run ./benchmarks/plot --bench gpu --in gpu.jsonl --in nccl.txt --out gpu.png
//	go run ./benchmarks/plot --bench gpu --in gpu.jsonl --paths tensorferry-staging-gpu,raw-tcp,naive --out tcp.svg
//
// The x axis (bytes per message) is logarithmic; the y axis is GB/s (10^9
// bytes per second). --bench keeps the results of one program; with --bench
// gpu the NCCL script's rows are kept too. The output format follows the
// file name's extension (.svg, .png, .pdf). When several results have the
// same path and size (several files, several runs), the last one read is
// drawn. On the GPU host NVLink paths run at hundreds of GB/s and TCP paths
// at a few: draw them apart with --paths, or use --logy.
package main
