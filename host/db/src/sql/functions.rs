//! sandflow's own SQL functions, registered in every session's context:
//! GreptimeDB's `database()` and the sketch functions.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// Registers sandflow's functions in `ctx`.
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(CurrentDatabase::new()));
}

/// `database()`: the session's database (GreptimeDB's and MySQL's name;
/// `schema()` is the same).
#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentDatabase {
    signature: Signature,
    aliases: Vec<String>,
}

impl CurrentDatabase {
    fn new() -> Self {
        CurrentDatabase {
            signature: Signature::nullary(Volatility::Stable),
            aliases: vec!["schema".to_string()],
        }
    }
}

impl ScalarUDFImpl for CurrentDatabase {
    fn name(&self) -> &str {
        "database"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let database = args.config_options.catalog.default_schema.clone();
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(database))))
    }
}
