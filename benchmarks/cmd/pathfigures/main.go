// Pathfigures prints the figures of how far a request's code is spread:
// the files and the calls from one file into another that a chat request
// (and an SSE one, whose body fasthttp reads after the handler returns)
// can reach from the proxy's handler, the calls that go back to a file
// that the path already left (a cycle between files), the longest
// functions, and the number of test files.
//
//	scripts/pathfigures.sh
//
// The calls are the static ones of the module's non-test code, resolved
// with go/types; a call through an interface reaches every method of the
// module that implements it. The path is followed through router/; a
// call from it into upstream/, prefixcache/ or pinstore/ counts, with its
// file, but is not followed further: those packages are the replica's
// side and the caches, with their own figures.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

const module = "github.com/warmroute/warmroute/"

var followed = []string{"prefixcache", "upstream", "pinstore", "router"} // in import order

// roots are where a request enters the module's code: the handler, and
// the body stream's methods, which fasthttp calls.
var roots = []string{"router.(*Handler).Serve", "router.(*exchange).Read", "router.(*exchange).CloseWithError"}

func main() {
	fset := token.NewFileSet()
	exports := exportData()
	gc := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	checked := map[string]*types.Package{}
	imp := importerFunc(func(path string) (*types.Package, error) {
		if p, ok := checked[path]; ok {
			return p, nil
		}
		return gc.Import(path)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	decls := map[*types.Func]*ast.FuncDecl{}
	var funcs []*types.Func
	for _, dir := range followed {
		files := parseDir(fset, dir)
		conf := types.Config{Importer: imp}
		pkg, err := conf.Check(module+dir, fset, files, info)
		if err != nil {
			fail(err)
		}
		checked[module+dir] = pkg
		for _, f := range files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok {
					fn := info.Defs[fd.Name].(*types.Func)
					decls[fn] = fd
					funcs = append(funcs, fn)
				}
			}
		}
	}
	fileOf := func(fn *types.Func) string {
		return strings.TrimPrefix(fset.Position(decls[fn].Pos()).Filename, root()+"/")
	}
	// The module's named types, for calls through an interface.
	var named []*types.Named
	for _, p := range checked {
		for _, n := range p.Scope().Names() {
			if tn, ok := p.Scope().Lookup(n).(*types.TypeName); ok {
				if nt, ok := tn.Type().(*types.Named); ok {
					named = append(named, nt)
				}
			}
		}
	}
	callees := func(fn *types.Func) []*types.Func {
		var out []*types.Func
		ast.Inspect(decls[fn].Body, func(n ast.Node) bool {
			var id *ast.Ident
			switch e := n.(type) {
			case *ast.Ident:
				id = e
			case *ast.SelectorExpr:
				id = e.Sel
			default:
				return true
			}
			f, ok := info.Uses[id].(*types.Func)
			if !ok {
				return true
			}
			if _, ok := decls[f]; ok {
				out = append(out, f)
				return true
			}
			// An interface method: every implementation in the module.
			sig := f.Type().(*types.Signature)
			if sig.Recv() == nil || !types.IsInterface(sig.Recv().Type()) {
				return true
			}
			iface := sig.Recv().Type().Underlying().(*types.Interface)
			for _, nt := range named {
				for _, t := range []types.Type{nt, types.NewPointer(nt)} {
					if types.IsInterface(nt) || !types.Implements(t, iface) {
						continue
					}
					obj, _, _ := types.LookupFieldOrMethod(t, true, nil, f.Name())
					if m, ok := obj.(*types.Func); ok {
						if _, ok := decls[m]; ok {
							out = append(out, m)
						}
					}
					break
				}
			}
			return true
		})
		return out
	}
	// Every function a request can reach, and the calls between files.
	reached := map[*types.Func]bool{}
	var queue []*types.Func
	for _, fn := range funcs {
		for _, r := range roots {
			if name(fn) == r {
				reached[fn] = true
				queue = append(queue, fn)
			}
		}
	}
	if len(queue) != len(roots) {
		fail(fmt.Errorf("found %d of the roots %v", len(queue), roots))
	}
	type edge struct{ from, to string }
	type call struct{ from, to *types.Func }
	seenCall := map[call]bool{}
	cross := map[edge]int{}
	fileEdges := map[string]map[string]bool{}
	for len(queue) > 0 {
		fn := queue[0]
		queue = queue[1:]
		for _, c := range callees(fn) {
			if seenCall[call{fn, c}] {
				continue
			}
			seenCall[call{fn, c}] = true
			if a, b := fileOf(fn), fileOf(c); a != b {
				cross[edge{a, b}]++
				if fileEdges[a] == nil {
					fileEdges[a] = map[string]bool{}
				}
				fileEdges[a][b] = true
			}
			if !reached[c] {
				reached[c] = true
				if c.Pkg().Path() == module+"router" {
					queue = append(queue, c)
				}
			}
		}
	}
	files := map[string]bool{}
	for fn := range reached {
		files[fileOf(fn)] = true
	}
	calls := 0
	for _, n := range cross {
		calls += n
	}
	// A call back: a call from file a to file b where b also reaches a.
	reaches := func(from, to string) bool {
		seen := map[string]bool{from: true}
		stack := []string{from}
		for len(stack) > 0 {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for g := range fileEdges[f] {
				if g == to {
					return true
				}
				if !seen[g] {
					seen[g] = true
					stack = append(stack, g)
				}
			}
		}
		return false
	}
	var back []string
	for e := range cross {
		if reaches(e.to, e.from) {
			back = append(back, e.from+" -> "+e.to)
		}
	}
	sort.Strings(back)
	fmt.Printf("request path: %d functions in %d files; %d calls from one file into another (distinct caller and callee, between %d file pairs); %d file pairs call back\n",
		len(reached), len(files), calls, len(cross), len(back))
	for _, b := range back {
		fmt.Println("  back:", b)
	}
	var names []string
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	fmt.Println("files:", strings.Join(names, " "))
	// The longest functions of the module's non-test code outside
	// benchmarks/ (main included), in lines.
	type fnLen struct {
		name  string
		lines int
	}
	var lens []fnLen
	for _, p := range append([]string{"."}, followed...) {
		for _, f := range parseDir(fset, p) {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
					pos := fset.Position(fd.Pos())
					lens = append(lens, fnLen{fmt.Sprintf("%s:%d %s", strings.TrimPrefix(pos.Filename, root()+"/"), pos.Line, fd.Name.Name), n})
				}
			}
		}
	}
	sort.Slice(lens, func(i, j int) bool { return lens[i].lines > lens[j].lines })
	fmt.Println("longest functions:")
	for _, l := range lens[:8] {
		fmt.Printf("  %3d %s\n", l.lines, l.name)
	}
	tests, _ := filepath.Glob(filepath.Join(root(), "*", "*_test.go"))
	top, _ := filepath.Glob(filepath.Join(root(), "*_test.go"))
	perDir := map[string]int{}
	for _, t := range append(tests, top...) {
		perDir[filepath.Base(filepath.Dir(t))]++
	}
	fmt.Printf("test files: %d outside benchmarks/ (router %d, upstream %d, prefixcache %d)\n",
		len(tests)+len(top), perDir["router"], perDir["upstream"], perDir["prefixcache"])
}

type importerFunc func(string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// exportData returns the compiler's export data file of every package that
// the followed ones import, built by go list.
func exportData() map[string]string {
	args := []string{"list", "-export", "-deps", "-json=ImportPath,Export"}
	for _, d := range followed {
		args = append(args, "./"+d)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Stderr = root(), os.Stderr
	out, err := cmd.Output()
	if err != nil {
		fail(err)
	}
	m := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			fail(err)
		}
		m[p.ImportPath] = p.Export
	}
	return m
}

func parseDir(fset *token.FileSet, dir string) []*ast.File {
	paths, _ := filepath.Glob(filepath.Join(root(), dir, "*.go"))
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") || (strings.Contains(p, "_other.go") && !strings.Contains(p, "linux")) {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			fail(err)
		}
		files = append(files, f)
	}
	return files
}

func name(fn *types.Func) string {
	s := strings.ReplaceAll(fn.FullName(), module, "") // (*router.exchange).Read
	if strings.HasPrefix(s, "(*") {
		pkg, rest, _ := strings.Cut(s[2:], ".")
		s = pkg + ".(*" + rest
	}
	return s
}

func root() string {
	wd, _ := os.Getwd()
	return wd
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pathfigures:", err)
	os.Exit(1)
}
