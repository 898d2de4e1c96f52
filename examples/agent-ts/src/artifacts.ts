// Artifacts by file:// URI in the shared artifact folder, laid out exactly as the Go file
// store (internal/artifact.Files) lays them out, so Go stages read what this runner writes
// and the other way round:
//
//   <root>/<job_id>/<stage>-r<round>/<type><ext>     ext from the media type (.json, .md, .txt, .bin)
//
// Writes go to a temporary file in the same folder and are renamed into place, so a reader
// never sees half an artifact. Reads are refused outside the root and above 4 MiB.

import { create } from "@bufbuild/protobuf";
import { createHash } from "node:crypto";
import { mkdir, open, readFile, rename, rm, stat } from "node:fs/promises";
import * as path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { ArtifactSchema, type Artifact } from "./gen/handoff/v1/handoff_pb.js";

/**
 * DEFAULT_ROOT is where `handoff up`, run from the repository root, keeps its artifacts
 * (handoff-data/artifacts), wherever this example is started from.
 */
export const DEFAULT_ROOT = fileURLToPath(new URL("../../../handoff-data/artifacts", import.meta.url));

/** MAX_BYTES caps one artifact, as artifact.MaxBytes does. */
export const MAX_BYTES = 4 << 20;

const safeName = /^[A-Za-z0-9][A-Za-z0-9_.:-]*$/;

/** What an artifact is, by what produced it (artifact.Ref). */
export type Ref = {
  jobId: string;
  stage: string;
  round: number;
  type: string;
  schemaVersion: string;
  mediaType: string;
};

function extFor(mediaType: string): string {
  switch (mediaType) {
    case "application/json":
      return ".json";
    case "text/markdown":
      return ".md";
    case "text/plain":
      return ".txt";
  }
  return ".bin";
}

export function sha256Hex(data: Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

export class FileStore {
  readonly root: string;

  constructor(root: string) {
    this.root = path.resolve(root);
  }

  /** put stores data and returns the Artifact that points at it (sha256 set). */
  async put(ref: Ref, data: Uint8Array): Promise<Artifact> {
    if (data.length > MAX_BYTES) throw new Error(`artifact ${ref.jobId}/${ref.stage}/${ref.type}: larger than 4 MiB`);
    for (const [name, v] of [["job_id", ref.jobId], ["stage", ref.stage], ["type", ref.type]] as const) {
      if (!safeName.test(v) || v.includes("..")) throw new Error(`artifact: ${name} ${JSON.stringify(v)} is not usable in a path`);
    }
    const dir = path.join(this.root, ref.jobId, `${ref.stage}-r${ref.round}`);
    await mkdir(dir, { recursive: true });
    const file = path.join(dir, ref.type + extFor(ref.mediaType));
    const tmp = path.join(dir, `.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`);
    try {
      const fh = await open(tmp, "wx", 0o644);
      try {
        await fh.writeFile(data);
      } finally {
        await fh.close();
      }
      await rename(tmp, file);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    return create(ArtifactSchema, {
      type: ref.type,
      schemaVersion: ref.schemaVersion,
      uri: pathToFileURL(file).href,
      mediaType: ref.mediaType,
      sha256: sha256Hex(data),
      producedBy: ref.stage,
    });
  }

  /** get returns the bytes behind a file:// URI under the root. */
  async get(uri: string): Promise<Buffer> {
    let u: URL;
    try {
      u = new URL(uri);
    } catch {
      throw new Error(`artifact uri ${JSON.stringify(uri)} is not a URL`);
    }
    if (u.protocol !== "file:") throw new Error(`artifact uri ${JSON.stringify(uri)}: scheme ${JSON.stringify(u.protocol.replace(/:$/, ""))} is not served by the file store`);
    const file = path.normalize(fileURLToPath(u));
    const rel = path.relative(this.root, file);
    if (rel === "" || rel === ".." || rel.startsWith(".." + path.sep) || path.isAbsolute(rel)) {
      throw new Error(`artifact uri ${JSON.stringify(uri)} is outside the artifact root ${this.root}`);
    }
    const st = await stat(file);
    if (st.size > MAX_BYTES) throw new Error(`artifact ${JSON.stringify(uri)}: larger than 4 MiB`);
    return readFile(file);
  }
}

/** verify checks data against the artifact's recorded digest, when it has one. */
export function verify(a: Artifact, data: Uint8Array): void {
  if (a.sha256 === "") return;
  const got = sha256Hex(data);
  if (got !== a.sha256) throw new Error(`artifact ${a.uri}: sha256 ${got} does not match recorded ${a.sha256}`);
}
