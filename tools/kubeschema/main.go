// Command kubeschema turns Kubernetes' OpenAPI v2 document (swagger.json,
// from the k8s.io/kubernetes module the Go module proxy serves) into one
// JSON Schema file per kind, standalone (every $ref inlined) and strict
// (no property the API does not define), named as kubeconform looks them
// up: <kind>[-<group>]-<version>.json, all lower case, where <group> is
// the first label of the API group (apps, rbac, admissionregistration) and
// the core group has none (pod-v1.json).
//
//	go run ./tools/kubeschema -o DIR swagger.json
//
// Why not the published schemas: CI machines reach the Go module proxy
// and Debian's archive only, and the schemas should be those of the
// Kubernetes version the test cluster runs.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const refPrefix = "#/definitions/"

// quantity is written as a string ("512Mi") or a number (1).
const quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"

// gvk is one x-kubernetes-group-version-kind entry.
type gvk struct {
	Group, Version, Kind string
}

func main() {
	out := flag.String("o", "", "output directory")
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: kubeschema -o DIR swagger.json")
		os.Exit(2)
	}
	n, err := convert(flag.Arg(0), *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeschema:", err)
		os.Exit(1)
	}
	fmt.Printf("kubeschema: %d schemas in %s\n", n, *out)
}

func convert(swagger, dir string) (int, error) {
	b, err := os.ReadFile(swagger)
	if err != nil {
		return 0, err
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return 0, fmt.Errorf("%s: %w", swagger, err)
	}
	if len(doc.Definitions) == 0 {
		return 0, fmt.Errorf("%s: no definitions", swagger)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	n := 0
	for name, def := range doc.Definitions {
		kinds, err := kindsOf(def)
		if err != nil {
			return n, fmt.Errorf("%s: %w", name, err)
		}
		if len(kinds) == 0 {
			continue
		}
		schema := expand(def, doc.Definitions, map[string]bool{name: true}, true)
		data, err := json.MarshalIndent(schema, "", "  ")
		if err != nil {
			return n, fmt.Errorf("%s: %w", name, err)
		}
		for _, k := range kinds {
			if err := os.WriteFile(filepath.Join(dir, fileName(k)), data, 0o644); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

func kindsOf(def map[string]any) ([]gvk, error) {
	raw, ok := def["x-kubernetes-group-version-kind"]
	if !ok {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	var ks []gvk
	if err := json.Unmarshal(b, &ks); err != nil {
		return nil, errors.New("bad x-kubernetes-group-version-kind")
	}
	return ks, nil
}

// fileName is kubeconform's default name for a kind's schema.
func fileName(k gvk) string {
	name := strings.ToLower(k.Kind)
	if g := strings.ToLower(strings.Split(k.Group, ".")[0]); g != "" {
		name += "-" + g
	}
	return name + "-" + strings.ToLower(k.Version) + ".json"
}

// expand returns s with every $ref inlined (a reference back into a
// definition being expanded, such as a CRD's JSONSchemaProps, becomes "any
// value"), additionalProperties false on every object that lists its
// properties, and Kubernetes' string-or-number types as such. Fields may be
// null, as the API server accepts (top is the document itself: not null).
func expand(s map[string]any, defs map[string]map[string]any, seen map[string]bool, top bool) map[string]any {
	if ref, ok := s["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, refPrefix)
		if name == quantity {
			return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}, map[string]any{"type": "null"}}}
		}
		if seen[name] {
			return map[string]any{}
		}
		def, ok := defs[name]
		if !ok {
			return map[string]any{}
		}
		seen[name] = true
		out := expand(def, defs, seen, top)
		delete(seen, name)
		return out
	}
	out := map[string]any{}
	for k, v := range s {
		switch k {
		case "x-kubernetes-group-version-kind", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key",
			"x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-unions":
			continue
		case "properties":
			props := map[string]any{}
			for pn, pv := range v.(map[string]any) {
				props[pn] = expand(pv.(map[string]any), defs, seen, false)
			}
			out[k] = props
		case "items":
			if m, ok := v.(map[string]any); ok {
				out[k] = expand(m, defs, seen, false)
			} else {
				out[k] = v
			}
		case "additionalProperties":
			if m, ok := v.(map[string]any); ok {
				out[k] = expand(m, defs, seen, false)
			} else {
				out[k] = v
			}
		default:
			out[k] = v
		}
	}
	switch out["format"] {
	case "int-or-string":
		delete(out, "type")
		delete(out, "format")
		out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
	}
	if _, ok := out["properties"]; ok {
		if _, set := out["additionalProperties"]; !set {
			out["additionalProperties"] = false
		}
	}
	delete(out, "format") // formats are not asserted: their names differ between OpenAPI and JSON Schema
	if t, ok := out["type"].(string); ok && !top {
		out["type"] = []any{t, "null"}
	}
	return out
}
