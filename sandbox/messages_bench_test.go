package sandbox_test

import (
	"context"
	"testing"
	"time"

	"tine/sandbox"
)

// BenchmarkSendMessage: one message from a sandbox to its fork, on disk
// (appended and fsync'd) when it returns; the inbox is emptied now and
// then, untimed, to stay under its bound.
func BenchmarkSendMessage(b *testing.B) {
	e := newEnv(b, 2)
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	if _, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 1}); err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"task":"build","n":12345}`)
	for i := 0; b.Loop(); i++ {
		if i%200 == 199 {
			b.StopTimer()
			if _, err := e.m.Messages(ctx, "p-1", sandbox.ReadOptions{Take: true}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if _, err := e.m.SendMessage(ctx, "p", "p-1", body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMessageWake: from a send to the return of a read waiting on
// the inbox, the message taken.
func BenchmarkMessageWake(b *testing.B) {
	e := newEnv(b, 2)
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	if _, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 1}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		got := make(chan time.Time, 1)
		ready := make(chan struct{})
		go func() {
			close(ready)
			msgs, err := e.m.Messages(ctx, "p-1", sandbox.ReadOptions{Take: true, Wait: time.Minute})
			if err != nil || len(msgs) != 1 {
				b.Error(err, len(msgs))
			}
			got <- time.Now()
		}()
		<-ready
		b.StopTimer()
		time.Sleep(time.Millisecond) // let the reader wait
		b.StartTimer()
		if _, err := e.m.SendMessage(ctx, "p", "p-1", []byte(`"go"`)); err != nil {
			b.Fatal(err)
		}
		<-got
	}
}
