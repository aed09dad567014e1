package main

import (
	"context"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptrace"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/warmroute/warmroute/benchmarks/certtest"
	"github.com/warmroute/warmroute/benchmarks/sim"
)

// A certificate that cannot serve, or a TLS flag that cannot work, stops
// warmroute at start with exit 2 and a message that names the flag.
func TestBadTLSFailsAtStartup(t *testing.T) {
	bin := build(t)
	ca := certtest.NewCA(t, "test CA")
	dir, other := t.TempDir(), t.TempDir()
	cert, key := ca.Leaf(t, "127.0.0.1").Write(t, dir)
	_, otherKey := ca.Leaf(t, "127.0.0.1").Write(t, other)
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert-file", dir + "/none.pem", "-tls-key-file", key}, "-tls-cert-file, -tls-key-file: certificate " + dir + "/none.pem with key " + key + ": open " + dir + "/none.pem: no such file or directory"},
		{[]string{"-tls-cert-file", dir, "-tls-key-file", key}, "is a directory"},
		{[]string{"-tls-cert-file", cert, "-tls-key-file", otherKey}, "-tls-cert-file, -tls-key-file: certificate " + cert + " with key " + otherKey + ": tls: private key does not match public key"},
		{[]string{"-tls-cert-file", key, "-tls-key-file", key}, "failed to find certificate PEM data"},
		{[]string{"-tls-cert-file", cert}, "-tls-cert-file and -tls-key-file go together"},
		{[]string{"-admin-tls-key-file", key}, "-admin-tls-cert-file and -admin-tls-key-file go together"},
		{[]string{"-admin-tls-cert-file", cert, "-admin-tls-key-file", otherKey}, "-admin-tls-cert-file, -admin-tls-key-file: certificate"},
		{[]string{"-upstream-ca-file", dir + "/none.pem"}, "-upstream-ca-file: open"},
		{[]string{"-upstream-ca-file", key}, "-upstream-ca-file " + key + " holds no PEM certificate"},
		{[]string{"-upstream-ca-file", caFile, "-upstream-insecure-skip-verify"}, "-upstream-ca-file and -upstream-insecure-skip-verify are exclusive"},
	} {
		out, err := exec.Command(bin, append([]string{"-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", ""}, tt.args...)...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tt.want) {
			t.Errorf("%v: exit %v, output %q; want exit 2 with %q", tt.args, err, out, tt.want)
		}
	}
}

// The official OpenAI and Anthropic Go clients reach an https:// replica
// through warmroute over TLS on both sides: the front with -tls-cert-file,
// the replica verified with -upstream-ca-file under -upstream-server-name
// (its certificate names vllm.test, not its address), whose models,
// capacity and queue are read over TLS too. The admin listener takes
// HTTPS with the same files. On SIGHUP a new certificate serves the next
// handshake while a keep-alive connection opened before carries on, and a
// bad one is refused and logged, the certificate served staying.
func TestClientsOverTLS(t *testing.T) {
	bin := build(t)
	replicaCA, frontCA := certtest.NewCA(t, "replicas' CA"), certtest.NewCA(t, "front CA")
	cfg := sim.DefaultConfig()
	cfg.TLS = replicaCA.ServerConfig(t, "vllm.test")
	rep, err := sim.NewReplica("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Stop()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "replicas-ca.pem")
	certtest.WriteFile(t, caFile, replicaCA.PEM)
	first := frontCA.Leaf(t, "127.0.0.1")
	cert, key := first.Write(t, dir)

	cmd, front, admin, logs := startWarmroute(t, bin, "-upstream", rep.URL(), "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-tls-cert-file", cert, "-tls-key-file", key, "-admin-tls-cert-file", cert, "-admin-tls-key-file", key,
		"-upstream-ca-file", caFile, "-upstream-server-name", "vllm.test", "-scrape-interval", "100ms")
	logs.waitFor(t, `msg="replica KV capacity" replica=`+rep.Addr()+` tokens=240000 from=/metrics`)
	logs.waitFor(t, `msg="replica models" replica=`+rep.Addr()+` models=sim-30b`)

	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: frontCA.ClientConfig()}}
	ctx := context.Background()
	oc := openai.NewClient(option.WithBaseURL("https://"+front+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0), option.WithHTTPClient(httpClient))
	var raw *http.Response
	chat, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "sim-30b", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello over TLS")}}, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("OpenAI chat completion over TLS: %v\n%s", err, logs)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.PromptTokens == 0 || raw.Header.Get("X-Warmroute-Replica") != rep.Addr() {
		t.Fatalf("chat completion %+v from %q", chat, raw.Header.Get("X-Warmroute-Replica"))
	}
	ac := anthropic.NewClient(anthropicoption.WithBaseURL("https://"+front+"/"), anthropicoption.WithAPIKey("sk-test"), anthropicoption.WithMaxRetries(0), anthropicoption.WithHTTPClient(httpClient))
	msg, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "sim-30b", MaxTokens: 4,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello over TLS"))}})
	if err != nil {
		t.Fatalf("Anthropic Messages over TLS: %v\n%s", err, logs)
	}
	if len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.InputTokens == 0 {
		t.Fatalf("message %+v", msg)
	}

	var table struct{ Replicas []struct{ URL, State string } }
	if status := getJSON(t, httpClient, "https://"+admin+"/replicas", &table); status != 200 || len(table.Replicas) != 1 || table.Replicas[0].URL != rep.URL() || table.Replicas[0].State != "live" {
		t.Fatalf("admin /replicas over TLS: %d %+v", status, table)
	}

	kept := &http.Client{Transport: &http.Transport{TLSClientConfig: frontCA.ClientConfig()}}
	if serial, _ := health(t, kept, front); serial.Cmp(first.Serial) != 0 {
		t.Fatalf("serial %v, want %v", serial, first.Serial)
	}
	second := frontCA.Leaf(t, "127.0.0.1")
	second.Write(t, dir)
	cmd.Process.Signal(syscall.SIGHUP)
	logs.waitFor(t, `msg="certificate reloaded" cert_file=`+cert)
	if serial, _ := health(t, &http.Client{Transport: &http.Transport{TLSClientConfig: frontCA.ClientConfig()}}, front); serial.Cmp(second.Serial) != 0 {
		t.Fatalf("after SIGHUP, a new connection met serial %v, want %v", serial, second.Serial)
	}
	if serial, reused := health(t, kept, front); !reused || serial.Cmp(first.Serial) != 0 {
		t.Fatalf("the keep-alive connection opened before: reused %v, serial %v", reused, serial)
	}
	certtest.WriteFile(t, cert, frontCA.Leaf(t, "127.0.0.1").CertPEM) // the second's key no longer matches
	cmd.Process.Signal(syscall.SIGHUP)
	logs.waitFor(t, `msg="certificate not reloaded; the old one stays" cert_file=`+cert)
	if serial, _ := health(t, &http.Client{Transport: &http.Transport{TLSClientConfig: frontCA.ClientConfig()}}, front); serial.Cmp(second.Serial) != 0 {
		t.Fatalf("after a bad certificate, a new connection met serial %v, want the old %v", serial, second.Serial)
	}
}

// health asks the front's /health with client and returns the serial of
// the certificate that its connection met, and whether the connection was
// reused.
func health(t *testing.T, client *http.Client, front string) (*big.Int, bool) {
	t.Helper()
	var reused bool
	req, _ := http.NewRequest(http.MethodGet, "https://"+front+"/health", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/health: %d", resp.StatusCode)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber, reused
}

// getJSON decodes the answer to GET url into v and returns its status.
func getJSON(t *testing.T, client *http.Client, url string, v any) int {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode
}
