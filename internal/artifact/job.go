package artifact

import (
	"net/url"
	"path/filepath"
	"strings"
)

// InJobFolder reports whether uri names a file inside job jobID's folder under root, the
// folder Files.Put stores that job's artifacts in (root/<job_id>/...): a file:// URI with no
// host, whose path, cleaned as Files.Get cleans it, lies strictly below root/<job_id>. It
// only looks at the URI (no file is opened), so a pure check at submit: what is there when
// it is read is the reader's business. An empty root or job id is never a match.
func InJobFolder(root, jobID, uri string) bool {
	if root == "" || jobID == "" || !safeName.MatchString(jobID) || strings.Contains(jobID, "..") {
		return false
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "file" || u.Host != "" || u.Opaque != "" {
		return false
	}
	dir := filepath.Join(root, jobID)
	rel, err := filepath.Rel(dir, filepath.Clean(filepath.FromSlash(u.Path)))
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}
