package pipeline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Load reads and checks the pipeline file at path. It refuses a pipeline with any
// error-severity problem: the error (an *Error) lists them all, one per line, as
// file:line:col: rule: message. Warnings do not stop a pipeline.
func Load(file string) (*Pipeline, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return load(file, data)
}

// LoadFS is Load for a file in fsys (for example the embedded pipelines.FS).
func LoadFS(fsys fs.FS, file string) (*Pipeline, error) {
	data, err := fs.ReadFile(fsys, file)
	if err != nil {
		return nil, err
	}
	return load(file, data)
}

func load(name string, data []byte) (*Pipeline, error) {
	p, problems, err := Parse(name, data)
	if err != nil {
		return nil, err
	}
	if HasErrors(problems) {
		return nil, &Error{File: name, Problems: problems}
	}
	return p, nil
}

// LoadDir loads every *.yaml and *.yml file directly in dir and returns the pipelines by
// name. See LoadAll.
func LoadDir(dir string) (map[string]*Pipeline, error) {
	return loadAll(os.DirFS(dir), func(name string) string { return filepath.Join(dir, name) })
}

// LoadAll loads every *.yaml and *.yml file at the root of fsys and returns the pipelines
// by name. It fails when any file fails to load (the error covers every failing file) or
// when two files declare the same pipeline name. No files is an empty map, not an error.
func LoadAll(fsys fs.FS) (map[string]*Pipeline, error) {
	return loadAll(fsys, func(name string) string { return name })
}

func loadAll(fsys fs.FS, display func(string) string) (map[string]*Pipeline, error) {
	files, err := PipelineFiles(fsys, ".")
	if err != nil {
		return nil, err
	}
	var (
		loaded []*Pipeline
		errs   []error
	)
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p, err := load(display(f), data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		loaded = append(loaded, p)
	}
	out := map[string]*Pipeline{}
	for _, p := range loaded {
		out[p.Name] = p
	}
	for _, pr := range CheckNames(loaded) {
		errs = append(errs, errors.New(pr.String()))
	}
	for _, pr := range CheckSubJobs(out) {
		if pr.IsError() {
			errs = append(errs, errors.New(pr.String()))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// CheckNames reports pipelines that reuse the name of an earlier one in ps (rule
// pipeline-name), at the later pipeline's name. Nil entries are skipped.
func CheckNames(ps []*Pipeline) []Problem {
	first := map[string]*Pipeline{}
	var out []Problem
	for _, p := range ps {
		if p == nil || p.Name == "" {
			continue
		}
		prev, dup := first[p.Name]
		if !dup {
			first[p.Name] = p
			continue
		}
		at := (&linter{p: p}).at("name", "")
		out = append(out, Problem{File: p.Source, Line: at.line, Col: at.col, Rule: "pipeline-name", Severity: SeverityError,
			Message: fmt.Sprintf("pipeline %q is also declared in %s: pipeline names must be unique", p.Name, orWord(prev.Source, "another pipeline"))})
	}
	return out
}

// PipelineFiles lists the *.yaml and *.yml files directly in dir of fsys, sorted.
func PipelineFiles(fsys fs.FS, dir string) ([]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if ext := strings.ToLower(path.Ext(e.Name())); ext == ".yaml" || ext == ".yml" {
			files = append(files, path.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	return files, nil
}
