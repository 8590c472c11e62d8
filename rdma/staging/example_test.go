package staging_test

import (
	"bytes"
	"fmt"

	"github.com/tensorferry/tensorferry/rdma/staging"
	"github.com/tensorferry/tensorferry/wire"
)

// The staging data protocol: one REQUEST from the fetcher, DATA chunks and
// an END from the owner.
func ExampleFramer() {
	var conn bytes.Buffer
	w := staging.NewFramer(nil, &conn, 0)
	_ = w.WriteRequest(1, staging.Request{ExportID: 7, Lease: 42, Incarnation: 1, Length: 6, ChunkSize: 4})
	_ = w.WriteData(1, 0, []byte("tens"))
	_ = w.WriteData(1, 4, []byte("or"))
	_ = w.WriteStatus(staging.FrameEnd, 1, staging.Status{Code: wire.CodeNoError})

	r := staging.NewFramer(&conn, nil, 4)
	for {
		f, err := r.ReadFrame()
		if err != nil {
			break
		}
		switch f.Type {
		case staging.FrameRequest:
			fmt.Println(f.Type, "export", f.Request.ExportID, "bytes", f.Request.Length)
		case staging.FrameData:
			fmt.Println(f.Type, "at", f.Offset, string(f.Data))
		default:
			fmt.Println(f.Type, f.Status.Code)
		}
	}
	// Output:
	// REQUEST export 7 bytes 6
	// DATA at 0 tens
	// DATA at 4 or
	// END NoError
}
