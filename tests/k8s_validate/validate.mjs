// Validates Kubernetes objects offline, read as YAML documents from stdin (`kubectl kustomize
// DIR | node validate.mjs`): each object against its API schema (kubernetes-models), and every
// field against the API's model (@kubernetes/client-node), so that a misspelled or misplaced
// field fails instead of being dropped by the API server. Exits 1 and names each problem.
import * as k8s from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";

async function schemaErrors(obj) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : [null, obj.apiVersion];
  const path = group ? `kubernetes-models/${group}/${version}/${obj.kind}` : `kubernetes-models/${version}/${obj.kind}`;
  let Model;
  try {
    Model = (await import(path))[obj.kind];
  } catch (e) {
    return [`no schema for ${obj.apiVersion} ${obj.kind}`];
  }
  try {
    new Model(obj).validate();
    return [];
  } catch (e) {
    return [String(e.message || e)];
  }
}

// Walks `value` along client-node's model `typeName`, reporting keys the model does not have.
function unknownFields(value, typeName, where, out) {
  if (value === null || value === undefined) return;
  const array = /^Array<(.+)>$/.exec(typeName);
  if (array) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, array[1], `${where}[${i}]`, out));
    return;
  }
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(typeName);
  if (map) {
    for (const [k, v] of Object.entries(value)) unknownFields(v, map[1], `${where}.${k}`, out);
    return;
  }
  const Model = k8s[typeName];
  if (!Model || typeof Model.getAttributeTypeMap !== "function" || typeof value !== "object") return;
  const attributes = Model.getAttributeTypeMap();
  for (const [key, v] of Object.entries(value)) {
    const attribute = attributes.find((a) => a.baseName === key);
    if (!attribute) {
      out.push(`${where}.${key}: unknown field (${typeName} has ${attributes.map((a) => a.baseName).join(", ")})`);
      continue;
    }
    unknownFields(v, attribute.type, `${where}.${key}`, out);
  }
}

let input = "";
for await (const chunk of process.stdin) input += chunk;
const problems = [];
let count = 0;
for (const doc of parseAllDocuments(input)) {
  const obj = doc.toJS();
  if (!obj) continue;
  count += 1;
  const name = `${obj.kind}/${obj.metadata?.name}`;
  for (const e of await schemaErrors(obj)) problems.push(`${name}: ${e}`);
  const version = (obj.apiVersion.split("/").pop() || "").replace(/^v/, "V");
  const out = [];
  unknownFields(obj, `${version}${obj.kind}`, name, out);
  problems.push(...out);
}
if (count === 0) problems.push("no objects on stdin");
for (const p of problems) console.error(p);
console.log(`${count} objects, ${problems.length} problems`);
process.exit(problems.length === 0 ? 0 : 1);
