// The build's first step: the schemas the client reads, from the repository's contract into
// dist/schemas, so the package carries them: the standalone current schemas
// (schemas/avro/standalone/) and every released version (schemas/avro/history/<Name>/),
// which each stand alone too, for records written before the current version.
const fs = require("node:fs");
const path = require("node:path");

const avro = path.join(__dirname, "..", "..", "..", "schemas", "avro");
const target = path.join(__dirname, "..", "dist", "schemas");
for (const name of ["UsageEvent", "Verdict", "BudgetPolicy", "BudgetRaise", "GenerationSwitch", "PriceTable"]) {
  fs.mkdirSync(path.join(target, "history", name), { recursive: true });
  fs.copyFileSync(path.join(avro, "standalone", `${name}.avsc`), path.join(target, `${name}.avsc`));
  for (const file of fs.readdirSync(path.join(avro, "history", name))) {
    if (/^v\d+\.avsc$/.test(file)) {
      fs.copyFileSync(path.join(avro, "history", name, file), path.join(target, "history", name, file));
    }
  }
}
