// Package size reads and writes the byte counts of the benchmark programs'
// flags and tables: a plain integer or one with a KiB, MiB or GiB suffix,
// the same forms cluster.yaml accepts.
//
//	n, _ := size.Parse("64KiB") // 65536
//	size.Format(16 << 20)       // "16MiB"
//	size.Format(1000)           // "1000"
package size
