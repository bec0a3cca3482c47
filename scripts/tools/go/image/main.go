// captf-image writes a container image as an OCI image layout tar (index.json, oci-layout and
// blobs/sha256/…, plus Docker's manifest.json so `docker load` takes it too) from folders staged
// by scripts/image/build.ts, without a daemon or a registry: one layer per LayerSpec, built with
// go-containerregistry. The output depends only on the staged files and the spec: entries in
// byte order, owner root, one fixed time, modes normalized, gzip from a pinned library.
//
//	captf-image <spec.json>   prints {"digest", "config", "layers": [...]} on stdout
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// Spec is what scripts/image/build.ts writes: the image's config and where its layers are staged.
type Spec struct {
	// Out is the tar to write.
	Out string `json:"out"`
	// Ref names the image in index.json and manifest.json (not part of the digest).
	Ref string `json:"ref"`
	// Created is the image's and every entry's time (SOURCE_DATE_EPOCH or 1970).
	Created      time.Time   `json:"created"`
	OS           string      `json:"os"`
	Architecture string      `json:"architecture"`
	Config       v1.Config   `json:"config"`
	Layers       []LayerSpec `json:"layers"`
}

// LayerSpec is one layer: the folders Paths (relative to Root, walked recursively).
type LayerSpec struct {
	Root  string   `json:"root"`
	Paths []string `json:"paths"`
	// ReadOnly removes every write bit, as `chmod -R a-w` does.
	ReadOnly bool `json:"readOnly"`
	// CreatedBy is the layer's history line (`docker history`).
	CreatedBy string `json:"createdBy"`
}

// Result is printed on stdout.
type Result struct {
	Digest string        `json:"digest"`
	Config string        `json:"config"`
	Layers []LayerResult `json:"layers"`
}

// LayerResult describes one written layer.
type LayerResult struct {
	Digest string `json:"digest"`
	DiffID string `json:"diffID"`
	Size   int64  `json:"size"`
}

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: captf-image <spec.json>"))
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var s Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		fail(fmt.Errorf("%s: %w", os.Args[1], err))
	}
	s.Created = s.Created.UTC()
	img, results, err := buildImage(s)
	if err != nil {
		fail(err)
	}
	if err := writeLayout(s, img); err != nil {
		fail(err)
	}
	res := Result{Layers: results}
	d, err := img.Digest()
	if err != nil {
		fail(err)
	}
	c, err := img.ConfigName()
	if err != nil {
		fail(err)
	}
	res.Digest, res.Config = d.String(), c.String()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "captf-image:", err)
	os.Exit(1)
}

// buildImage appends one gzip layer per LayerSpec to an empty OCI image and sets its config.
func buildImage(s Spec) (v1.Image, []LayerResult, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	var results []LayerResult
	for _, ls := range s.Layers {
		tarBytes, err := layerTar(ls, s.Created)
		if err != nil {
			return nil, nil, err
		}
		gz, err := gzipBytes(tarBytes)
		if err != nil {
			return nil, nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(gz)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: ls.CreatedBy},
		})
		if err != nil {
			return nil, nil, err
		}
		d, _ := layer.Digest()
		diff, _ := layer.DiffID()
		results = append(results, LayerResult{Digest: d.String(), DiffID: diff.String(), Size: int64(len(gz))})
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: s.Created}
	cf.OS, cf.Architecture = s.OS, s.Architecture
	cf.Config = s.Config
	img, err = mutate.ConfigFile(img, cf)
	return img, results, err
}

// gzipBytes compresses with a pinned gzip (same input, same bytes) and no name or time in the header.
func gzipBytes(b []byte) ([]byte, error) {
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// layerTar writes the layer's folders as a tar: byte order (WalkDir's), root-owned, time `created`.
func layerTar(ls LayerSpec, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := append([]string(nil), ls.Paths...)
	sort.Strings(paths)
	for _, p := range paths {
		err := filepath.WalkDir(filepath.Join(ls.Root, p), func(file string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return addEntry(tw, ls, file, created)
		})
		if err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addEntry writes one file, folder or symlink; any other kind of file is an error.
func addEntry(tw *tar.Writer, ls LayerSpec, file string, created time.Time) error {
	info, err := os.Lstat(file)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(ls.Root, file)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: created, Mode: int64(entryMode(info.Mode()))}
	switch {
	case info.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
	case info.Mode()&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(file); err != nil {
			return err
		}
	case info.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
	default:
		return fmt.Errorf("%s: neither a file, a folder nor a symlink", file)
	}
	if ls.ReadOnly && hdr.Typeflag != tar.TypeSymlink {
		hdr.Mode &^= 0o222
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// entryMode normalizes a staged mode, so umask and the stager's owner do not show: folders
// 0755 (1777 when sticky, like /tmp), files 0755 when anyone may execute them else 0644.
func entryMode(m fs.FileMode) fs.FileMode {
	switch {
	case m&fs.ModeSymlink != 0:
		return 0o777
	case m.IsDir() && m&fs.ModeSticky != 0:
		return 0o777 | fs.FileMode(0o1000)
	case m.IsDir():
		return 0o755
	case m&0o111 != 0:
		return 0o755
	default:
		return 0o644
	}
}

// writeLayout writes the OCI image layout tar (with Docker's manifest.json) to s.Out.
func writeLayout(s Spec, img v1.Image) error {
	files, err := layoutFiles(s, img)
	if err != nil {
		return err
	}
	out, err := os.Create(s.Out)
	if err != nil {
		return err
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: s.Created}); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(files[name])), ModTime: s.Created}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(files[name]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return out.Close()
}

// layoutFiles returns every file of the layout by name: blobs, index.json, oci-layout, manifest.json.
func layoutFiles(s Spec, img v1.Image) (map[string][]byte, error) {
	files := map[string][]byte{"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`)}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	digest, _ := img.Digest()
	files[blob(digest)] = manifest
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	configName, _ := img.ConfigName()
	files[blob(configName)] = config
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	var layerNames []string
	for _, l := range layers {
		d, _ := l.Digest()
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		files[blob(d)] = b
		layerNames = append(layerNames, blob(d))
	}
	base := path.Base(s.Ref)
	if !strings.Contains(base, ":") {
		return nil, fmt.Errorf("ref %q has no tag", s.Ref)
	}
	tag := base[strings.LastIndex(base, ":")+1:]
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Digest:      digest,
			Size:        int64(len(manifest)),
			Annotations: map[string]string{"io.containerd.image.name": s.Ref, "org.opencontainers.image.ref.name": tag},
			Platform:    &v1.Platform{OS: s.OS, Architecture: s.Architecture},
		}},
	}
	if files["index.json"], err = json.Marshal(index); err != nil {
		return nil, err
	}
	docker := []map[string]any{{"Config": blob(configName), "RepoTags": []string{s.Ref}, "Layers": layerNames}}
	if files["manifest.json"], err = json.Marshal(docker); err != nil {
		return nil, err
	}
	return files, nil
}
