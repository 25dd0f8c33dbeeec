// Package gitops evaluates the health checks Berth ships for GitOps tools
// (deploy/gitops) the way those tools do, so that tests can judge objects
// read from real clusters with them: Argo CD's Lua health scripts (with
// gopher-lua, the interpreter Argo CD embeds, and the libraries it opens),
// Flux's healthCheckExprs (CEL, evaluated as kustomize-controller does) and
// kstatus (sigs.k8s.io/cli-utils), which Flux and kubectl wait use for
// everything else. It does not run Argo CD or Flux.
package gitops

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// Health is a health check's verdict: Argo CD's status (Healthy,
// Progressing, Degraded, Suspended, Missing, Unknown) or kstatus's
// (Current, InProgress, Failed, Terminating, Unknown), and its message.
type Health struct {
	Status, Message string
}

func (h Health) String() string { return h.Status + ": " + h.Message }

// ArgoCD runs the Lua health script at path on obj as Argo CD does: the
// global obj holds the object, only the base, table and (safe) os libraries
// are open, and a run is cut at one second.
func ArgoCD(path string, obj *unstructured.Unstructured) (Health, error) {
	script, err := os.ReadFile(path)
	if err != nil {
		return Health{}, err
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj.Object))
	if err := L.DoString(string(script)); err != nil {
		return Health{}, fmt.Errorf("run %s: %w", filepath.Base(path), err)
	}
	ret := L.Get(-1)
	t, ok := ret.(*lua.LTable)
	if !ok {
		return Health{}, fmt.Errorf("%s returned %s, not a table", filepath.Base(path), ret.Type())
	}
	h := Health{Status: lua.LVAsString(t.RawGetString("status")), Message: lua.LVAsString(t.RawGetString("message"))}
	switch h.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return h, nil
	}
	return Health{}, fmt.Errorf("%s returned status %q, which Argo CD does not know", filepath.Base(path), h.Status)
}

// toLua converts a decoded JSON value as Argo CD does: maps become tables,
// slices arrays, numbers numbers.
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := L.CreateTable(0, len(v))
		for k, x := range v {
			t.RawSetString(k, toLua(L, x))
		}
		return t
	case []any:
		t := L.CreateTable(len(v), 0)
		for _, x := range v {
			t.Append(toLua(L, x))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case int:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	}
	return lua.LNil
}

// Kstatus is kstatus's verdict on obj.
func Kstatus(obj *unstructured.Unstructured) (Health, error) {
	res, err := status.Compute(obj)
	if err != nil {
		return Health{}, err
	}
	return Health{Status: res.Status.String(), Message: res.Message}, nil
}

// FluxCheck is one entry of a Flux Kustomization's spec.healthCheckExprs.
type FluxCheck struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Current    string `json:"current"`
	InProgress string `json:"inProgress,omitempty"`
	Failed     string `json:"failed,omitempty"`
}

// FluxChecks reads the healthCheckExprs of the Flux Kustomization at path.
func FluxChecks(path string) ([]FluxCheck, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var k struct {
		Spec struct {
			HealthCheckExprs []FluxCheck `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, err
	}
	return k.Spec.HealthCheckExprs, nil
}

// Flux judges obj with the check of its kind in checks, as
// kustomize-controller does: a status.observedGeneration behind the
// generation is InProgress; then inProgress, failed and current are
// evaluated in that order, the first true one decides, and none is
// InProgress. The expressions see the object's top-level fields.
func Flux(checks []FluxCheck, obj *unstructured.Unstructured) (Health, error) {
	gvk := obj.GroupVersionKind()
	var check *FluxCheck
	for i, c := range checks {
		if c.Kind == gvk.Kind && c.APIVersion == gvk.GroupVersion().String() {
			check = &checks[i]
		}
	}
	if check == nil {
		return Health{}, fmt.Errorf("no health check expression for %s", gvk)
	}
	if og, found, err := unstructured.NestedInt64(obj.Object, "status", "observedGeneration"); err == nil && found && og != obj.GetGeneration() {
		return Health{Status: status.InProgressStatus.String(), Message: "generation not observed"}, nil
	}
	env, err := cel.NewEnv(cel.OptionalTypes(), ext.Strings(), ext.Sets(), ext.Encoders())
	if err != nil {
		return Health{}, err
	}
	for _, e := range []struct {
		expr string
		st   status.Status
	}{{check.InProgress, status.InProgressStatus}, {check.Failed, status.FailedStatus}, {check.Current, status.CurrentStatus}} {
		if e.expr == "" {
			continue
		}
		ast, iss := env.Parse(e.expr)
		if iss.Err() != nil {
			return Health{}, fmt.Errorf("parse %q: %w", e.expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			return Health{}, err
		}
		out, _, err := prg.Eval(obj.Object)
		if err != nil {
			return Health{}, fmt.Errorf("evaluate %q on %s %s: %w", e.expr, gvk.Kind, obj.GetName(), err)
		}
		if b, ok := out.Value().(bool); ok && b {
			return Health{Status: e.st.String(), Message: e.expr}, nil
		}
	}
	return Health{Status: status.InProgressStatus.String(), Message: "no expression matched"}, nil
}
