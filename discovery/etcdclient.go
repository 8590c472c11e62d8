package discovery

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Bounds on what etcd's answers may make this package hold. An answer
// beyond them fails its request; nothing is allocated for bytes that have
// not arrived.
const (
	// maxResponse bounds a unary answer (a page of a range included).
	maxResponse = 16 << 20
	// maxWatchLine bounds one object of the watch stream: one batch of
	// events. etcd splits its batches near its request limit (1.5 MiB by
	// default) unless asked not to.
	maxWatchLine = 16 << 20
	// maxKeepaliveLine bounds the answer to a keepalive.
	maxKeepaliveLine = 64 << 10
	// maxValue bounds the value of one registration in bytes; a larger one
	// is skipped.
	maxValue = 16 << 10
	// rangePage is how many keys one range request asks for.
	rangePage = 512
	// maxNodes bounds the registrations read under the prefix.
	maxNodes = 1 << 16
)

// errLeaseNotFound is what etcd answers about a lease that expired or was
// revoked.
var errLeaseNotFound = errors.New("etcdserver: requested lease not found")

// etcdError is an error answered by etcd (a gRPC status carried by the
// gateway).
type etcdError struct {
	Code    int    // the gRPC code
	Message string // etcd's message
}

func (e *etcdError) Error() string {
	return fmt.Sprintf("discovery: etcd: %s (code %d)", e.Message, e.Code)
}

// Is matches errLeaseNotFound for etcd's lease-not-found error.
func (e *etcdError) Is(target error) bool {
	return target == errLeaseNotFound && e.Message == errLeaseNotFound.Error()
}

// errCompacted reports that a watch asked for revisions etcd no longer
// keeps.
type errCompacted struct{ rev int64 }

func (e *errCompacted) Error() string {
	return fmt.Sprintf("discovery: etcd: watch: revisions up to %d were compacted", e.rev)
}

// client speaks etcd's v3 API through its HTTP/JSON gateway (the client
// port's /v3/... paths), with net/http only: the official client brings
// gRPC, which this module does not import.
type client struct {
	endpoints []string
	cur       atomic.Uint32 // index of the endpoint in use
	tr        *http.Transport
	hc        *http.Client
	timeout   time.Duration // of each unary request
	page      int64         // keys per range request: rangePage (tests lower it)
	max       int64         // bytes of a unary answer: maxResponse (tests lower it)
	maxLine   int           // bytes of a watch batch: maxWatchLine (tests lower it)
}

func newClient(endpoints []string, timeout time.Duration) *client {
	for i, ep := range endpoints {
		endpoints[i] = strings.TrimSuffix(ep, "/")
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	hc := &http.Client{
		Transport: tr,
		// etcd never redirects: a redirect is not followed anywhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &client{endpoints: endpoints, tr: tr, hc: hc, timeout: timeout, page: rangePage, max: maxResponse, maxLine: maxWatchLine}
}

// close drops the idle connections (and their goroutines).
func (c *client) close() { c.tr.CloseIdleConnections() }

// endpoint returns the endpoint in use.
func (c *client) endpoint() string {
	return c.endpoints[int(c.cur.Load())%len(c.endpoints)]
}

// failed moves on to the next endpoint after a failed exchange with ep.
func (c *client) failed(ep string) {
	i := c.cur.Load()
	if c.endpoints[int(i)%len(c.endpoints)] == ep {
		c.cur.CompareAndSwap(i, i+1)
	}
}

// post sends the JSON of req to path and returns the answer, whose status
// is 200 (other statuses are decoded into an *etcdError). The caller
// closes the body.
func (c *client) post(ctx context.Context, path string, req any) (*http.Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("discovery: etcd: %s: %w", path, err)
	}
	ep := c.endpoint()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, ep+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("discovery: etcd: %s: %w", path, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	// etcd's require-leader flag (what clientv3.WithRequireLeader sets):
	// a member cut off from its cluster's leader refuses the request, or
	// ends the watch, instead of serving what it has.
	hr.Header.Set("Grpc-Metadata-hasleader", "true")
	resp, err := c.hc.Do(hr)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) { // refused, reset or timed out
			c.failed(ep)
		}
		return nil, fmt.Errorf("discovery: etcd %s: %w", ep, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, rerr := readBounded(resp.Body, maxKeepaliveLine)
		if rerr != nil {
			return nil, fmt.Errorf("discovery: etcd %s%s: %s: %w", ep, path, resp.Status, rerr)
		}
		e, derr := decodeError(b)
		if derr != nil {
			return nil, fmt.Errorf("discovery: etcd %s%s: %s", ep, path, resp.Status)
		}
		if e.Code == codeUnavailable {
			c.failed(ep)
		}
		return nil, e
	}
	return resp, nil
}

// unary posts req and returns the whole answer, at most maxResponse bytes.
// An endpoint that cannot be reached is followed by the next one, each
// tried once.
func (c *client) unary(ctx context.Context, path string, req any) ([]byte, error) {
	var err error
	for range c.endpoints {
		var b []byte
		b, err = c.unaryOnce(ctx, path, req)
		var ee *etcdError
		if err == nil || errors.As(err, &ee) && ee.Code != codeUnavailable || errors.Is(err, errTooLarge) || ctx.Err() != nil {
			return b, err
		}
	}
	return nil, err
}

func (c *client) unaryOnce(ctx context.Context, path string, req any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.post(ctx, path, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := readBounded(resp.Body, c.max)
	if err != nil {
		return nil, fmt.Errorf("discovery: etcd %s: %w", path, err)
	}
	return b, nil
}

// codeUnavailable is gRPC's Unavailable: the etcd member has no leader or
// is shutting down.
const codeUnavailable = 14

// errTooLarge reports an answer beyond the bound of its kind.
var errTooLarge = errors.New("answer too large")

// readBounded reads r to its end, failing when it holds more than max
// bytes.
func readBounded(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: more than %d bytes", errTooLarge, max)
	}
	return b, nil
}

// i64 is an int64 that etcd's gateway writes as a JSON string ("42"); a
// plain number is accepted too.
type i64 int64

func (v *i64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("bad integer %.32q", b)
	}
	*v = i64(n)
	return nil
}

// header is etcd's ResponseHeader, of which only the revision matters.
type header struct {
	Revision i64 `json:"revision"`
}

// keyValue is one key of etcd (mvccpb.KeyValue).
type keyValue struct {
	Key         []byte `json:"key"`
	Value       []byte `json:"value"`
	ModRevision i64    `json:"mod_revision"`
	Lease       i64    `json:"lease"`
	// oversized: the value was beyond what an answer may hold, and was
	// not read.
	oversized bool
}

// errorResponse is the gateway's answer to a failed unary request.
type errorResponse struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	Code    int    `json:"code"`
}

// decodeError decodes the body of a failed request.
func decodeError(b []byte) (*etcdError, error) {
	var r errorResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	msg := r.Message
	if msg == "" {
		msg = r.Error
	}
	if msg == "" {
		return nil, errors.New("no error message")
	}
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return &etcdError{Code: r.Code, Message: msg}, nil
}

// streamError is the error object of a streaming answer.
type streamError struct {
	GRPCCode int    `json:"grpc_code"`
	Message  string `json:"message"`
}

func (s *streamError) err() error {
	msg := s.Message
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return &etcdError{Code: s.GRPCCode, Message: msg}
}

type grantResponse struct {
	Header header `json:"header"`
	ID     i64    `json:"ID"`
	TTL    i64    `json:"TTL"`
	Error  string `json:"error"`
}

// decodeGrant decodes the answer to lease/grant: the lease and its TTL in
// seconds.
func decodeGrant(b []byte) (id, ttl int64, err error) {
	var r grantResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, 0, fmt.Errorf("discovery: etcd: lease grant: %w", err)
	}
	if r.Error != "" {
		return 0, 0, fmt.Errorf("discovery: etcd: lease grant: %.512s", r.Error)
	}
	if r.ID == 0 || r.TTL <= 0 {
		return 0, 0, fmt.Errorf("discovery: etcd: lease grant: no lease in the answer (ID %d, TTL %d)", r.ID, r.TTL)
	}
	return int64(r.ID), int64(r.TTL), nil
}

// grant asks for a lease of ttl seconds.
func (c *client) grant(ctx context.Context, ttl int64) (id, granted int64, err error) {
	b, err := c.unary(ctx, "/v3/lease/grant", struct {
		TTL int64 `json:"TTL,string"`
	}{ttl})
	if err != nil {
		return 0, 0, err
	}
	return decodeGrant(b)
}

type keepaliveLine struct {
	Result *struct {
		ID  i64 `json:"ID"`
		TTL i64 `json:"TTL"`
	} `json:"result"`
	Error *streamError `json:"error"`
}

// decodeKeepalive decodes the first object of the lease/keepalive stream:
// the lease's new TTL in seconds, 0 when the lease is gone.
func decodeKeepalive(b []byte, id int64) (ttl int64, err error) {
	var r keepaliveLine
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("discovery: etcd: lease keepalive: %w", err)
	}
	if r.Error != nil {
		return 0, r.Error.err()
	}
	if r.Result == nil {
		return 0, errors.New("discovery: etcd: lease keepalive: no result")
	}
	if int64(r.Result.ID) != id {
		return 0, fmt.Errorf("discovery: etcd: lease keepalive: answer for lease %x, asked %x", r.Result.ID, id)
	}
	if r.Result.TTL < 0 {
		return 0, nil
	}
	return int64(r.Result.TTL), nil
}

// keepalive renews lease id once and returns its TTL in seconds, 0 when
// it expired or was revoked. The gateway's keepalive is a stream: one
// request in the body, then the body's end closes the stream after the
// answer.
func (c *client) keepalive(ctx context.Context, id int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.post(ctx, "/v3/lease/keepalive", struct {
		ID int64 `json:"ID,string"`
	}{id})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := readLine(bufio.NewReader(resp.Body), maxKeepaliveLine)
	if err != nil {
		return 0, fmt.Errorf("discovery: etcd: lease keepalive: %w", err)
	}
	// etcd ends the stream after its answer: reading to the end keeps the
	// connection for the next request.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxKeepaliveLine))
	return decodeKeepalive(line, id)
}

// revoke ends lease id and deletes its keys.
func (c *client) revoke(ctx context.Context, id int64) error {
	_, err := c.unary(ctx, "/v3/lease/revoke", struct {
		ID int64 `json:"ID,string"`
	}{id})
	return err
}

type rangeResponse struct {
	Header header     `json:"header"`
	Kvs    []keyValue `json:"kvs"`
	More   bool       `json:"more"`
}

// decodeRange decodes the answer to kv/range.
func decodeRange(b []byte) (*rangeResponse, error) {
	var r rangeResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("discovery: etcd: range: %w", err)
	}
	if r.Header.Revision <= 0 {
		return nil, fmt.Errorf("discovery: etcd: range: bad revision %d", r.Header.Revision)
	}
	return &r, nil
}

type rangeRequest struct {
	Key      []byte `json:"key"`
	RangeEnd []byte `json:"range_end,omitempty"`
	Limit    int64  `json:"limit,string,omitempty"`
	Revision int64  `json:"revision,string,omitempty"`
	KeysOnly bool   `json:"keys_only,omitempty"`
}

// rangePrefix calls each for every key under prefix, reading pages of
// rangePage keys, all at the first page's revision, which it returns. Only
// a page is held at a time; a page beyond maxResponse (large values) is
// asked again with half the keys, down to one.
func (c *client) rangePrefix(ctx context.Context, prefix []byte, each func(keyValue)) (int64, error) {
	req := rangeRequest{Key: prefix, RangeEnd: prefixEnd(prefix), Limit: c.page}
	n := 0
	for {
		b, err := c.unary(ctx, "/v3/kv/range", req)
		if errors.Is(err, errTooLarge) && req.Limit > 1 {
			req.Limit /= 2
			continue
		}
		if errors.Is(err, errTooLarge) {
			// One key whose value alone is beyond the bound: learn
			// its key only, report it oversized, and go on after it.
			kr := req
			kr.KeysOnly = true
			b, err = c.unary(ctx, "/v3/kv/range", kr)
			if err != nil {
				return 0, err
			}
			r, err := decodeRange(b)
			if err != nil {
				return 0, err
			}
			if req.Revision == 0 {
				req.Revision = int64(r.Header.Revision)
			}
			if len(r.Kvs) == 0 {
				return req.Revision, nil
			}
			if n++; n > maxNodes {
				return 0, fmt.Errorf("discovery: etcd: more than %d keys under %q", maxNodes, prefix)
			}
			kv := r.Kvs[0]
			kv.oversized = true
			each(kv)
			if !r.More {
				return req.Revision, nil
			}
			req.Key = append(bytes.Clone(kv.Key), 0)
			continue
		}
		if err != nil {
			return 0, err
		}
		req.Limit = min(2*req.Limit, c.page)
		r, err := decodeRange(b)
		if err != nil {
			return 0, err
		}
		if req.Revision == 0 {
			req.Revision = int64(r.Header.Revision)
		}
		if n += len(r.Kvs); n > maxNodes {
			return 0, fmt.Errorf("discovery: etcd: more than %d keys under %q", maxNodes, prefix)
		}
		for _, kv := range r.Kvs {
			if bytes.Compare(kv.Key, req.Key) < 0 {
				return 0, errors.New("discovery: etcd: range: keys out of order")
			}
			each(kv)
		}
		if !r.More || len(r.Kvs) == 0 {
			return req.Revision, nil
		}
		req.Key = append(bytes.Clone(r.Kvs[len(r.Kvs)-1].Key), 0)
	}
}

// prefixEnd is the range_end that selects every key starting with p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0} // every key
}

type compare struct {
	Key            []byte `json:"key"`
	Target         string `json:"target"`
	Result         string `json:"result"`
	CreateRevision *int64 `json:"create_revision,string,omitempty"`
	ModRevision    *int64 `json:"mod_revision,string,omitempty"`
	Lease          *int64 `json:"lease,string,omitempty"`
}

type putRequest struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
	Lease int64  `json:"lease,string,omitempty"`
}

type requestOp struct {
	RequestPut   *putRequest   `json:"request_put,omitempty"`
	RequestRange *rangeRequest `json:"request_range,omitempty"`
}

type txnRequest struct {
	Compare []compare   `json:"compare"`
	Success []requestOp `json:"success"`
	Failure []requestOp `json:"failure,omitempty"`
}

type txnResponse struct {
	Header    header `json:"header"`
	Succeeded bool   `json:"succeeded"`
	Responses []struct {
		ResponseRange *rangeResponse `json:"response_range"`
	} `json:"responses"`
}

// decodeTxn decodes the answer to kv/txn: whether the comparisons held,
// and the keys of the first range among the operations run.
func decodeTxn(b []byte) (bool, []keyValue, error) {
	var r txnResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return false, nil, fmt.Errorf("discovery: etcd: txn: %w", err)
	}
	if r.Header.Revision <= 0 {
		return false, nil, fmt.Errorf("discovery: etcd: txn: bad revision %d", r.Header.Revision)
	}
	for _, op := range r.Responses {
		if op.ResponseRange != nil {
			return r.Succeeded, op.ResponseRange.Kvs, nil
		}
	}
	return r.Succeeded, nil, nil
}

// create puts key = value under lease if key does not exist. Otherwise it
// returns false and the key as it is.
func (c *client) create(ctx context.Context, key, value []byte, lease int64) (bool, []keyValue, error) {
	zero := int64(0)
	b, err := c.unary(ctx, "/v3/kv/txn", txnRequest{
		Compare: []compare{{Key: key, Target: "CREATE", Result: "EQUAL", CreateRevision: &zero}},
		Success: []requestOp{{RequestPut: &putRequest{Key: key, Value: value, Lease: lease}}},
		Failure: []requestOp{{RequestRange: &rangeRequest{Key: key}}},
	})
	if err != nil {
		return false, nil, err
	}
	return decodeTxn(b)
}

// putIfLease puts key = value under lease if key is held by that lease.
func (c *client) putIfLease(ctx context.Context, key, value []byte, lease int64) (bool, error) {
	b, err := c.unary(ctx, "/v3/kv/txn", txnRequest{
		Compare: []compare{{Key: key, Target: "LEASE", Result: "EQUAL", Lease: &lease}},
		Success: []requestOp{{RequestPut: &putRequest{Key: key, Value: value, Lease: lease}}},
	})
	if err != nil {
		return false, err
	}
	ok, _, err := decodeTxn(b)
	return ok, err
}

// replace puts key = value under lease if key was last modified at
// revision modRev (it is as the caller read it).
func (c *client) replace(ctx context.Context, key, value []byte, lease, modRev int64) (bool, error) {
	b, err := c.unary(ctx, "/v3/kv/txn", txnRequest{
		Compare: []compare{{Key: key, Target: "MOD", Result: "EQUAL", ModRevision: &modRev}},
		Success: []requestOp{{RequestPut: &putRequest{Key: key, Value: value, Lease: lease}}},
	})
	if err != nil {
		return false, err
	}
	ok, _, err := decodeTxn(b)
	return ok, err
}

// event is one change a watch reports.
type event struct {
	Type string   `json:"type"` // "" (PUT, the default) or "DELETE"
	Kv   keyValue `json:"kv"`
}

type watchLine struct {
	Result *struct {
		Header          header  `json:"header"`
		Created         bool    `json:"created"`
		Canceled        bool    `json:"canceled"`
		CompactRevision i64     `json:"compact_revision"`
		CancelReason    string  `json:"cancel_reason"`
		Events          []event `json:"events"`
	} `json:"result"`
	Error *streamError `json:"error"`
}

// watchResult is one answer of a watch: the events of a batch, or the
// watch's creation, or an error ending it (*errCompacted when the revision
// asked for was compacted).
type watchResult struct {
	created bool
	events  []event
}

// decodeWatch decodes one object of the watch stream.
func decodeWatch(b []byte) (watchResult, error) {
	var r watchLine
	if err := json.Unmarshal(b, &r); err != nil {
		return watchResult{}, fmt.Errorf("discovery: etcd: watch: %w", err)
	}
	if r.Error != nil {
		return watchResult{}, r.Error.err()
	}
	res := r.Result
	if res == nil {
		return watchResult{}, errors.New("discovery: etcd: watch: no result")
	}
	if res.Canceled {
		if res.CompactRevision > 0 {
			return watchResult{}, &errCompacted{rev: int64(res.CompactRevision)}
		}
		return watchResult{}, fmt.Errorf("discovery: etcd: watch canceled: %.512s", res.CancelReason)
	}
	for _, ev := range res.Events {
		if ev.Type != "" && ev.Type != "PUT" && ev.Type != "DELETE" {
			return watchResult{}, fmt.Errorf("discovery: etcd: watch: unknown event type %.32q", ev.Type)
		}
		if ev.Kv.ModRevision <= 0 {
			return watchResult{}, fmt.Errorf("discovery: etcd: watch: event with bad revision %d", ev.Kv.ModRevision)
		}
	}
	return watchResult{created: res.Created, events: res.Events}, nil
}

// watchStream is an open watch.
type watchStream struct {
	c    *client
	ep   string // the endpoint it reads from
	body io.ReadCloser
	r    *bufio.Reader
}

// watch watches the keys under prefix from revision start on. It lasts
// until ctx ends, the stream breaks, or close.
func (c *client) watch(ctx context.Context, prefix []byte, start int64) (*watchStream, error) {
	type createRequest struct {
		Key           []byte `json:"key"`
		RangeEnd      []byte `json:"range_end"`
		StartRevision int64  `json:"start_revision,string"`
	}
	resp, err := c.post(ctx, "/v3/watch", struct {
		CreateRequest createRequest `json:"create_request"`
	}{createRequest{Key: prefix, RangeEnd: prefixEnd(prefix), StartRevision: start}})
	if err != nil {
		return nil, err
	}
	return &watchStream{c: c, ep: resp.Request.URL.Scheme + "://" + resp.Request.URL.Host, body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10)}, nil
}

// next returns the stream's next answer.
func (w *watchStream) next() (watchResult, error) {
	for {
		line, err := readLine(w.r, w.c.maxLine)
		if err != nil {
			return watchResult{}, fmt.Errorf("discovery: etcd: watch: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		r, err := decodeWatch(line)
		var ee *etcdError
		if errors.As(err, &ee) && ee.Code == codeUnavailable {
			w.c.failed(w.ep) // this member lost its leader
		}
		return r, err
	}
}

func (w *watchStream) close() { w.body.Close() }

// readLine reads up to the next newline, failing past max bytes. The
// buffer grows only with the bytes read.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", errTooLarge, max)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0:
			return line, nil
		case errors.Is(err, io.EOF):
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
