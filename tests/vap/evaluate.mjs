// Evaluates a ValidatingAdmissionPolicy as the apiserver does: its matchConditions (a request that fails one
// is not evaluated at all), variables in order (each sees the earlier ones as `variables.<name>`), then the
// validations; the first false one denies with its messageExpression, or its message. CEL comes from @bufbuild/cel with the strings extension Kubernetes enables.
// A case may bring its own policy; one marked conditionsOnly is a webhook entry's matchConditions alone, its
// verdict "called" or "not called".
import { readFileSync } from "node:fs";
import { run, isCelError } from "@bufbuild/cel";
import { strings } from "@bufbuild/cel/ext";

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));

function evaluate(expression, bindings) {
  const value = run(expression, bindings, { funcs: strings });
  if (isCelError(value)) throw new Error(`${expression.slice(0, 60)}...: ${value.message ?? JSON.stringify(value)}`);
  return value;
}

let passed = 0;
let failed = 0;
for (const c of input.cases) {
  const spec = c.policy ?? input.policy;
  let verdict = c.conditionsOnly ? "called" : "allow";
  let message = "";
  try {
    const bindings = { object: c.object, oldObject: c.oldObject ?? null, params: c.params, request: c.request, variables: {} };
    const matched = (spec.matchConditions ?? []).every((condition) => {
      const value = evaluate(condition.expression, bindings);
      if (typeof value !== "boolean") throw new Error(`match condition is not a boolean: ${condition.expression}`);
      return value;
    });
    const unmatched = c.conditionsOnly ? "not called" : "allow";
    if (!matched) {
      if (c.expect === unmatched) passed++;
      else failed++;
      console.log(`${c.expect === unmatched ? "ok  " : "FAIL"} ${c.name}: not matched (matchConditions), ${unmatched}`);
      continue;
    }
    for (const variable of spec.variables) bindings.variables[variable.name] = evaluate(variable.expression, bindings);
    for (const validation of spec.validations) {
      const ok = evaluate(validation.expression, bindings);
      if (typeof ok !== "boolean") throw new Error(`validation is not a boolean: ${validation.expression}`);
      if (!ok) {
        verdict = "deny";
        message = validation.messageExpression ? String(evaluate(validation.messageExpression, bindings)) : validation.message;
        break;
      }
    }
  } catch (error) {
    verdict = `error (${error.message})`;
  }
  if (verdict === c.expect) {
    passed++;
    console.log(`ok   ${c.name}: ${verdict}${message ? ` (${message})` : ""}`);
  } else {
    failed++;
    console.log(`FAIL ${c.name}: expected ${c.expect}, got ${verdict}${message ? ` (${message})` : ""}`);
  }
}
console.log(`backstop: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
