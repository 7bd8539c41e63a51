//! Functions (entry points) and modules (a set of entry points over shared weights).

use crate::{Op, ParamRole, ResultRole, TensorType, WeightDecl};

/// An SSA value of one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    pub ty: TensorType,
    /// A readable name (`l3.q`); unnamed values print as `%N`. Unique within a function.
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub value: ValueId,
    pub role: ParamRole,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub result: ValueId,
    pub op: Op,
}

/// A named function result. A `NextState` result is named like the state parameter it is the next
/// value of.
#[derive(Clone, Debug, PartialEq)]
pub struct FuncResult {
    pub name: String,
    pub value: ValueId,
    pub role: ResultRole,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Function {
    pub name: String,
    pub values: Vec<ValueData>,
    pub params: Vec<Param>,
    pub body: Vec<Instr>,
    pub results: Vec<FuncResult>,
}

impl Function {
    pub fn new(name: impl Into<String>) -> Self {
        Function { name: name.into(), ..Default::default() }
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }

    pub fn value_name(&self, v: ValueId) -> Option<&str> {
        self.values[v.index()].name.as_deref()
    }

    /// Adds a value without defining it; callers attach it to a param or an instruction.
    pub fn new_value(&mut self, ty: TensorType, name: Option<String>) -> ValueId {
        self.values.push(ValueData { ty, name });
        ValueId(self.values.len() as u32 - 1)
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| self.value_name(p.value) == Some(name))
    }

    pub fn param_name(&self, p: &Param) -> &str {
        self.value_name(p.value).unwrap_or("")
    }

    pub fn result(&self, name: &str) -> Option<&FuncResult> {
        self.results.iter().find(|r| r.name == name)
    }

    /// Every `weight @name` instruction: its result and the weight's name.
    pub fn weight_reads(&self) -> impl Iterator<Item = (ValueId, &str)> {
        self.body.iter().filter_map(|i| match &i.op {
            crate::Op::Weight { name } => Some((i.result, name.as_str())),
            _ => None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    pub name: String,
    pub weights: Vec<WeightDecl>,
    pub functions: Vec<Function>,
}

impl Module {
    pub fn new(name: impl Into<String>) -> Self {
        Module { name: name.into(), ..Default::default() }
    }

    pub fn weight(&self, name: &str) -> Option<&WeightDecl> {
        self.weights.iter().find(|w| w.name == name)
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}
