package grpcfence_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/test/bufconn"

	grpcfence "github.com/fencelock/fencelock/kit/grpc"
)

// The test service, fencetest.KV, is defined by hand (no protoc): a
// grpc.ServiceDesc whose messages are Go structs carried by a JSON codec.
const (
	putMethod    = "/fencetest.KV/Put"
	getMethod    = "/fencetest.KV/Get"
	putAllMethod = "/fencetest.KV/PutAll"
	// batchResource is the resource every PutAll stream writes.
	batchResource = "batch"
)

type putRequest struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type putReply struct {
	Count int `json:"count"`
}

type getRequest struct {
	Name string `json:"name"`
}

type getReply struct {
	Value string `json:"value"`
	OK    bool   `json:"ok"`
}

// jsonCodec is the content-subtype "json" codec of the test service.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
func (jsonCodec) Name() string                    { return "json" }

func init() { encoding.RegisterCodec(jsonCodec{}) }

// kv is the test service: a map of values.
type kv struct {
	mu   sync.Mutex
	vals map[string]string
	// onPut, if set, runs in the Put and PutAll handlers before each write;
	// an error from it fails the call.
	onPut func(ctx context.Context, name, value string) error
	// puts counts the writes the handlers made.
	puts int
}

func (k *kv) put(ctx context.Context, name, value string) error {
	if k.onPut != nil {
		if err := k.onPut(ctx, name, value); err != nil {
			return err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.vals == nil {
		k.vals = map[string]string{}
	}
	k.vals[name] = value
	k.puts++
	return nil
}

func (k *kv) get(name string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.vals[name]
	return v, ok
}

func (k *kv) writes() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.puts
}

var kvDesc = grpc.ServiceDesc{
	ServiceName: "fencetest.KV",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Put", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(putRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				r := req.(*putRequest)
				return &putReply{Count: 1}, srv.(*kv).put(ctx, r.Name, r.Value)
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: putMethod}, h)
		}},
		{MethodName: "Get", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(getRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				v, ok := srv.(*kv).get(req.(*getRequest).Name)
				return &getReply{Value: v, OK: ok}, nil
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: getMethod}, h)
		}},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "PutAll", ClientStreams: true, Handler: func(srv any, ss grpc.ServerStream) error {
			n := 0
			for {
				var in putRequest
				err := ss.RecvMsg(&in)
				if errors.Is(err, io.EOF) {
					return ss.SendMsg(&putReply{Count: n})
				}
				if err != nil {
					return err
				}
				if err := srv.(*kv).put(ss.Context(), in.Name, in.Value); err != nil {
					return err
				}
				n++
			}
		}},
	},
}

// putAllDesc is the client's description of the PutAll stream.
var putAllDesc = &grpc.StreamDesc{StreamName: "PutAll", ClientStreams: true}

// kvResource names the resource of each fencetest.KV call: a Put writes
// the name it puts, a PutAll stream writes batchResource, a Get writes
// nothing.
func kvResource(method string, req any) string {
	switch method {
	case putMethod:
		return req.(*putRequest).Name
	case putAllMethod:
		return batchResource
	}
	return ""
}

// serve starts the test service behind fs's interceptors on an in-process
// listener and returns a client connection to it, built with opts (and
// the JSON codec). Both are stopped when t ends.
func serve(t testing.TB, fs *grpcfence.Server, k *kv, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(fs.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(fs.StreamInterceptor()),
	)
	srv.RegisterService(&kvDesc, k)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(jsonCodec{}.Name())),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-done
	})
	return conn
}

// put calls fencetest.KV/Put.
func put(ctx context.Context, conn *grpc.ClientConn, name, value string) error {
	return conn.Invoke(ctx, putMethod, &putRequest{Name: name, Value: value}, new(putReply))
}

// get calls fencetest.KV/Get.
func get(ctx context.Context, conn *grpc.ClientConn, name string) (string, bool, error) {
	var r getReply
	err := conn.Invoke(ctx, getMethod, &getRequest{Name: name}, &r)
	return r.Value, r.OK, err
}

// putAll sends puts on one PutAll stream and returns how many the server
// wrote.
func putAll(ctx context.Context, conn *grpc.ClientConn, puts ...putRequest) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, putAllDesc, putAllMethod)
	if err != nil {
		return 0, err
	}
	for i := range puts {
		if err := s.SendMsg(&puts[i]); err != nil {
			break // the server ended the stream: RecvMsg returns its status
		}
	}
	if err := s.CloseSend(); err != nil {
		return 0, err
	}
	var r putReply
	if err := s.RecvMsg(&r); err != nil {
		return 0, err
	}
	return r.Count, nil
}
